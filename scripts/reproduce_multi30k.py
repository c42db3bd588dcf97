"""The Multi30k headline in one command: train the CPU recipe, average, choose on val, score on test
(transformer_nmt.analysis.reproduce: the steps and what they write).

    python scripts/reproduce_multi30k.py [run_id=NAME] [KEY=VALUE ...]
    python scripts/reproduce_multi30k.py train=false run_id=NAME [KEY=VALUE ...]   # steps 2-4 of a trained run
    python scripts/reproduce_multi30k.py train=false run_dir=RUN                   # the same, by its directory
"""

import sys
from pathlib import Path

from transformer_nmt.analysis.reproduce import main

if __name__ == "__main__":
    main(sys.argv[1:], root=Path(__file__).resolve().parents[1])  # the recipe's data/ paths are the checkout's
