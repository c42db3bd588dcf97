"""How many checkpoints to average, and which length penalty, chosen on val (issue 36: why a run falls short).

    python studies/averaging_and_length_penalty.py run=outputs/multi30k_tiny_en_de/RUN sizes=[1,3,5,10] \
        alphas=[0.6,0.8,1.0,1.2,1.5] out=averaging_and_length_penalty.json

For every size K of ``sizes``, the newest K checkpoints of RUN/checkpoints/recent averaged (K=1: the newest alone),
each scored on val with beam ``beam`` under the ``length_penalty`` form at every exponent of ``alphas``: a grid of
val BLEU. The cell with the best val BLEU (``select_on=NAME``: the best value of another registered metric, in
its direction: the smallest TER) is then scored on test, with the run's own setting (``reference``: the
recipe's K and alpha) beside it, so the table says what val's choice is worth against the recipe as it stands.
The test set is never used for a choice. Writes ``out`` (JSON: every cell's cased, lowercased and
Multi30k-convention BLEU, chrF, length ratio and decode seconds; the choice; the provenance) and prints the grid.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ensemble_study import SCORES, SELECT_ON, kept, metrics_argument, selection_metric  # studies/: a row's scores

from transformer_nmt.checkpoint import atomic_torch_save
from transformer_nmt.inference.average import average_checkpoints, last_checkpoints
from transformer_nmt.inference.evaluate import main as evaluate
from transformer_nmt.metrics import catalog
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"run": None, "sizes": [1, 3, 5, 10], "alphas": [0.6, 0.8, 1.0, 1.2, 1.5], "length_penalty": "power",
           "beam": 5, "reference": [10, 1.0], "threads": 0, "max_tokens": 4096, "select_on": SELECT_ON,
           "out": "averaging_and_length_penalty.json", "work": None}
WORK = Path("outputs") / "averaging_and_length_penalty"
USAGE = ("python studies/averaging_and_length_penalty.py run=RUN [sizes=[1,3,5,10]] [alphas=[...]] [select_on=bleu] "
         "[out=FILE.json]")


def score(ckpt: Path, split: str, alpha: float, options: dict, out: Path) -> dict:
    result = evaluate([f"ckpt={ckpt}", f"split={split}", f"beam={options['beam']}", f"alpha={alpha}",
                       f"length_penalty={options['length_penalty']}", f"out={out}", f"threads={options['threads']}",
                       f"max_tokens={options['max_tokens']}", *metrics_argument(options["select_on"])])
    return {key: result.get(key) for key in kept(SCORES, options["select_on"])}


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["run"]:
        raise SystemExit("give run=RUN: a run directory with checkpoints/recent")
    selection_metric(options["select_on"])
    sizes, alphas = list(options["sizes"]), [float(a) for a in options["alphas"]]
    if not sizes or any(not isinstance(k, int) or k < 1 for k in sizes):
        raise SystemExit(f"sizes={sizes}: give whole numbers >= 1")
    reference = (int(options["reference"][0]), float(options["reference"][1]))
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    recent = last_checkpoints(Path(options["run"]) / "checkpoints" / "recent", max(sizes))
    if len(recent) < max(sizes):
        raise SystemExit(f"sizes={sizes}: {options['run']} keeps {len(recent)} recent checkpoints")
    work = Path(options["work"] or WORK / Path(options["out"]).stem)
    work.mkdir(parents=True, exist_ok=True)
    models = {}
    for size in sorted(set(sizes) | {reference[0]}):
        if size == 1:
            models[size] = recent[-1]
        else:
            models[size] = work / f"average_last{size}.ckpt"
            atomic_torch_save(average_checkpoints(recent[-size:]), models[size])
    grid = [{"size": size, "alpha": alpha,
             "val": score(models[size], "val", alpha, options, work / f"k{size}_a{alpha}")}
            for size in sizes for alpha in alphas]
    best_cell = catalog.best(grid, lambda cell: cell["val"][options["select_on"]], options["select_on"], "select_on")
    if best_cell is None:
        raise SystemExit(f"select_on={options['select_on']}: evaluate gave no value of it on val for any cell")
    chosen = {"size": best_cell["size"], "alpha": best_cell["alpha"], "val": best_cell["val"],
              "test": score(models[best_cell["size"]], "test", best_cell["alpha"], options, work / "chosen")}
    ref_val = next((c["val"] for c in grid if (c["size"], c["alpha"]) == reference), None)
    ref = {"size": reference[0], "alpha": reference[1],
           "val": ref_val or score(models[reference[0]], "val", reference[1], options, work / "reference"),
           "test": score(models[reference[0]], "test", reference[1], options, work / "reference")}
    result = {"options": options, "checkpoints": [str(p) for p in recent], "grid": grid, "chosen_on": "val",
              "chosen": chosen, "reference": ref, PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    return result


def markdown(result: dict) -> str:
    """The val grid, then the chosen cell and the reference on test."""
    alphas = sorted({cell["alpha"] for cell in result["grid"]})
    sizes = sorted({cell["size"] for cell in result["grid"]})
    val = {(c["size"], c["alpha"]): c["val"]["bleu"] for c in result["grid"]}
    lines = ["| averaged | " + " | ".join(f"alpha {a:g}" for a in alphas) + " |",
             "| --- | " + " | ".join("---" for _ in alphas) + " |"]
    lines += [f"| last {k} | " + " | ".join(f"{val[(k, a)]:.2f}" for a in alphas) + " |" for k in sizes]
    for name in ("chosen", "reference"):
        row = result[name]
        lines.append(f"\n{name}: last {row['size']}, alpha {row['alpha']:g}: val {row['val']['bleu']:.2f}, test "
                     f"{row['test']['bleu']:.2f} cased, {row['test']['bleu_multi30k']} in the Multi30k convention")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
