"""Does ensembling a recipe's own checkpoints beat averaging them? (issue 31)

    python scripts/ensemble_study.py run=outputs/multi30k_cpu/RUN last=5 out=ensemble_study.json
    python scripts/ensemble_study.py seeds=[multirun/ablation_base/ID/0,multirun/ablation_base/ID/1] out=seeds.json

Two comparisons, each scored with ``evaluate`` (beam ``beam``, sacreBLEU) on val and test, decode seconds beside:

- ``run=RUN``: the newest ``last`` checkpoints of RUN/checkpoints/recent/ as an ensemble (``ckpt=[...]``) against
  their average (``average``, as the recipe's averaged.ckpt is made) and against the newest alone;
- ``seeds=[RUN_A,RUN_B,...]``: independently seeded runs (each's averaged.ckpt, else its checkpoints/last.ckpt),
  each alone and all as one ensemble.

Within each comparison the row with the best val BLEU is chosen, and its test BLEU is the one to report (choose
on val). Writes ``out`` (JSON: every row, split and choice) and prints the table as Markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformer_nmt import run_files
from transformer_nmt.checkpoint import atomic_torch_save
from transformer_nmt.inference.average import average_checkpoints, last_checkpoints
from transformer_nmt.inference.evaluate import main as evaluate
from transformer_nmt.options import parse_options

OPTIONS = {"run": None, "last": 5, "seeds": [], "beam": 4, "splits": ["val", "test"], "threads": 0,
           "max_tokens": 4096, "out": "ensemble_study.json", "work": None}
USAGE = "python scripts/ensemble_study.py [run=RUN] [last=5] [seeds=[RUN_A,RUN_B]] [beam=4] [out=FILE.json]"


def run_checkpoint(run: Path) -> Path:
    """A run's model: its averaged.ckpt if it has one, else checkpoints/last.ckpt."""
    for path in (run / "averaged.ckpt", run / "checkpoints" / run_files.LAST):
        if path.is_file():
            return path
    raise SystemExit(f"seeds: {run} has neither averaged.ckpt nor checkpoints/{run_files.LAST}")


def score_row(name: str, ckpt: list[Path], options: dict, work: Path) -> dict:
    """evaluate's BLEU and decode seconds of one model (one path) or ensemble (several) on every split."""
    row = {"name": name, "checkpoints": [str(p) for p in ckpt]}
    spec = f"[{','.join(str(p) for p in ckpt)}]" if len(ckpt) > 1 else str(ckpt[0])
    for split in options["splits"]:
        result = evaluate([f"ckpt={spec}", f"split={split}", f"beam={options['beam']}", f"out={work / name}",
                           f"threads={options['threads']}", f"max_tokens={options['max_tokens']}"])
        row[split] = {"bleu": result["bleu"], "bleu_lowercase": result["bleu_lowercase"],
                      "decode_seconds": result["decode_seconds"], "sentences": result["sentences"]}
    return row


def choose_on_val(rows: list[dict]) -> dict:
    return max(rows, key=lambda row: row["val"]["bleu"]) if rows and "val" in rows[0] else {}


def markdown(groups: dict[str, list[dict]], splits: list[str]) -> str:
    header = "| comparison | model | " + " | ".join(f"{s} BLEU | {s} decode s" for s in splits) + " |"
    lines = [header, "| " + " | ".join(["---"] * (2 + 2 * len(splits))) + " |"]
    for group, rows in groups.items():
        chosen = choose_on_val(rows).get("name")
        for row in rows:
            mark = " (chosen on val)" if row["name"] == chosen else ""
            cells = " | ".join(f"{row[s]['bleu']:.2f} | {row[s]['decode_seconds']:.1f}" for s in splits)
            lines.append(f"| {group} | {row['name']}{mark} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["run"] and len(options["seeds"]) < 2:
        raise SystemExit("give run=RUN (its recent checkpoints), seeds=[RUN_A,RUN_B,...] (two runs or more), or both")
    work = Path(options["work"] or Path(options["out"]).with_suffix(""))
    work.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[dict]] = {}
    if options["run"]:
        run = Path(options["run"])
        recent = last_checkpoints(run / "checkpoints" / "recent", options["last"])
        averaged = work / f"average_last{len(recent)}.ckpt"
        atomic_torch_save(average_checkpoints(recent), averaged)
        name = f"last {len(recent)} recent"
        groups[name] = [score_row("newest alone", [recent[-1]], options, work),
                        score_row(f"average of {len(recent)}", [averaged], options, work),
                        score_row(f"ensemble of {len(recent)}", recent, options, work)]
    if options["seeds"]:
        runs = [Path(r) for r in options["seeds"]]
        paths = [run_checkpoint(r) for r in runs]
        rows = [score_row(f"seed run {r.name}", [p], options, work) for r, p in zip(runs, paths)]
        groups[f"{len(runs)} seeds"] = rows + [score_row(f"ensemble of {len(runs)} seeds", paths, options, work)]
    result = {"options": options, "groups": groups,
              "chosen_on_val": {group: choose_on_val(rows).get("name") for group, rows in groups.items()}}
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(groups, options["splits"]))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
