"""``python -m transformer_nmt.import_marian input=DIR output=model.ckpt``: a transformers MarianMT directory
(an opus-mt model, say) as our checkpoint.

The command lives in interchange/marian.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.interchange.marian import import_main as main

if __name__ == "__main__":
    main()
