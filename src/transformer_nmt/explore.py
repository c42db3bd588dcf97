"""``python -m transformer_nmt.explore [key=value ...]``: the attention explorer page.

The command lives in analysis/explore.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.analysis.explore import main

if __name__ == "__main__":
    main()
