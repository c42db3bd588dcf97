"""``python -m transformer_nmt.evaluate [key=value ...]``: score a checkpoint with sacreBLEU.

The command lives in inference/evaluate.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.inference.evaluate import main

if __name__ == "__main__":
    main()
