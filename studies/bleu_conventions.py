"""How far apart the BLEU conventions are on our own outputs: cased sacreBLEU (what we report), lowercased
sacreBLEU, and the Multi30k literature's lowercased, Moses-tokenized BLEU (inference/multi30k_bleu.py), each
computed with ``evaluate``'s own ``score`` over committed hypotheses and their references.

    python studies/bleu_conventions.py --json docs/quality/bleu_conventions.json

By default: every Table 3 run's greedy val hypotheses (docs/table3/CELL/seedK/val_hypotheses.txt, en->de, all
1,014 val sentences) against docs/table3/val_references.txt. Needs sacremoses (``transformer_nmt[compare]``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from transformer_nmt.inference.evaluate import score
from transformer_nmt.provenance import collect as collect_provenance

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("bleu", "bleu_lowercase", "bleu_multi30k")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "docs" / "table3", help="folder of CELL/seedK/ runs")
    parser.add_argument("--lang", default="de", help="the hypotheses' language (Moses tokenizer)")
    parser.add_argument("--json", type=Path, help="write the scores here")
    args = parser.parse_args(argv)
    provenance = collect_provenance({"args": {k: str(v) for k, v in vars(args).items()}})
    references = (args.runs / "val_references.txt").read_text(encoding="utf-8").splitlines()
    runs = {}
    for path in sorted(args.runs.glob("*/seed*/val_hypotheses.txt")):
        hypotheses = path.read_text(encoding="utf-8").splitlines()
        if len(hypotheses) != len(references):
            raise SystemExit(f"{path}: {len(hypotheses)} lines, {len(references)} references")
        metrics = score(hypotheses, references, args.lang)
        runs[str(path.parent.relative_to(args.runs))] = {k: metrics[k] for k in KEYS}
    if not runs:
        raise SystemExit(f"no */seed*/val_hypotheses.txt under {args.runs}")
    signatures = {k: metrics[f"{k}_signature"] for k in KEYS}
    differences = {"lowercase_minus_cased": [r["bleu_lowercase"] - r["bleu"] for r in runs.values()],
                   "multi30k_minus_cased": [r["bleu_multi30k"] - r["bleu"] for r in runs.values()],
                   "multi30k_minus_lowercase": [r["bleu_multi30k"] - r["bleu_lowercase"] for r in runs.values()]}
    summary = {name: {"median": round(statistics.median(d), 2), "min": round(min(d), 2), "max": round(max(d), 2)}
               for name, d in differences.items()}
    result = {"runs_dir": str(args.runs.relative_to(ROOT)) if args.runs.is_relative_to(ROOT) else str(args.runs),
              "sentences": len(references), "lang": args.lang, "signatures": signatures, "runs": runs,
              "differences": summary, "provenance": provenance}
    print(json.dumps({k: result[k] for k in ("sentences", "signatures", "differences")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
