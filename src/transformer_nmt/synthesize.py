"""``python -m transformer_nmt.synthesize [key=value ...]``: translate a corpus into pairs (distillation,
back-translation), in shards, resumable.

The command lives in inference/synthesize.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.inference.synthesize import main

if __name__ == "__main__":
    main()
