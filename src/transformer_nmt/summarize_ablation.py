"""``python -m transformer_nmt.summarize_ablation SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--resamples N]
[--metrics NAME ...]``: ablation runs in the layout of the paper's Table 3, mean ± std over seeds with a paired
bootstrap p-value against the base, for each registered metric named (default BLEU)
(transformer_nmt.analysis.ablation: what it reads and writes)."""

from __future__ import annotations

import sys

from transformer_nmt.analysis.ablation import main as summarize


def main(argv: list[str] | None = None) -> None:
    summarize(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
