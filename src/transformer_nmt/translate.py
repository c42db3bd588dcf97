"""``python -m transformer_nmt.translate [key=value ...]``: translate text with a checkpoint.

The command lives in inference/translate.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.inference.translate import main

if __name__ == "__main__":
    main()
