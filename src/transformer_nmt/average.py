"""``python -m transformer_nmt.average [key=value ...]``: average the weights of checkpoints.

The command lives in inference/average.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.inference.average import main

if __name__ == "__main__":
    main()
