"""``python -m transformer_nmt.table3 status|run|table [--study DIR] [--cells ...] [--max-runs N]
[--metrics NAME ...]``: the paper's Table 3 on Multi30k, resumable across sessions (transformer_nmt.analysis.table3:
the plan and where each run's files go; ``--metrics``: the registered metrics ``table`` summarizes, default BLEU).
Runs launch in the current directory (whose data/ the recipe reads) under outputs/table3/; the study's kept small
files go to ``--study`` (default ``table3/``; this repository's committed study: ``--study docs/table3``)."""

from __future__ import annotations

import sys
from pathlib import Path

from transformer_nmt.analysis.table3 import main as table3


def main(argv: list[str] | None = None) -> None:
    table3(sys.argv[1:] if argv is None else argv, root=Path.cwd())


if __name__ == "__main__":
    main()
