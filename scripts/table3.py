"""The Table 3 study on Multi30k (transformer_nmt.analysis.table3: the plan and where each run's files go).

    python scripts/table3.py status              # every (cell, seed) of the plan: done or missing, time left
    python scripts/table3.py run [--max-runs N] [--cells base heads1 ...]   # the missing runs, one at a time
    python scripts/table3.py table               # docs/table3/ablation.md, ablation.csv, plots
"""

import sys
from pathlib import Path

from transformer_nmt.analysis.table3 import main

if __name__ == "__main__":
    main(sys.argv[1:], root=Path(__file__).resolve().parents[1])  # the study lives in this checkout's docs/
