"""``python -m transformer_nmt.reproduce [experiment=multi30k_cpu|multi30k_tiny] [run_id=NAME] [KEY=VALUE ...]``:
train a Multi30k recipe, average its last checkpoints, choose on val (checkpoint, then the length penalty among
``alphas=A,B,...``), score on test, in the launch directory (whose data/ the recipe reads). The steps and what they
write: transformer_nmt.analysis.reproduce."""

from __future__ import annotations

import sys
from pathlib import Path

from transformer_nmt.analysis.reproduce import main as reproduce


def main(argv: list[str] | None = None) -> dict:
    return reproduce(sys.argv[1:] if argv is None else argv, root=Path.cwd())


if __name__ == "__main__":
    main()
