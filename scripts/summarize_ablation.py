"""Summarize ablation runs in the layout of the paper's Table 3 (transformer_nmt.analysis.ablation: what it reads
and writes).

    python scripts/summarize_ablation.py SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--resamples N]
    python scripts/summarize_ablation.py multirun/ablation_heads/RUN multirun/ablation_base/RUN
"""

import sys

from transformer_nmt.analysis.ablation import main

if __name__ == "__main__":
    main(sys.argv[1:])
