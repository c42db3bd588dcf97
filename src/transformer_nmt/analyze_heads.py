"""``python -m transformer_nmt.analyze_heads [key=value ...]``: head importance and pruning.

The command lives in analysis/heads.py; ``--help`` lists its options and their defaults.
"""

from transformer_nmt.analysis.heads import main

if __name__ == "__main__":
    main()
