"""``python -m transformer_nmt.export [key=value ...]``: export a checkpoint for CTranslate2.

The command lives in inference/export.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.inference.export import main

if __name__ == "__main__":
    main()
