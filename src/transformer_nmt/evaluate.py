"""``python -m transformer_nmt.evaluate [key=value ...]``: a checkpoint's metrics (sacreBLEU's, COMET, ...).

The command lives in inference/evaluate.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.inference.evaluate import main

if __name__ == "__main__":
    main()
