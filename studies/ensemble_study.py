"""Does ensembling a recipe's own checkpoints beat averaging them, and seeded runs each alone? (issue 31)

    python studies/ensemble_study.py run=outputs/multi30k_cpu_en_de/RUN last=5 sizes=[2,3] out=study_run.json
    python studies/ensemble_study.py seeds=[multirun/ablation_base/ID/0,multirun/ablation_base/ID/1] out=seeds.json

Two comparisons, each scored with ``evaluate`` (beam ``beam``, sacreBLEU) on every split of ``splits``, decode
seconds beside (``threads``: 0 is torch's default):

- ``run=RUN``: the newest ``last`` checkpoints of RUN/checkpoints/recent/ as an ensemble (``ckpt=[...]``)
  against their average (``average_checkpoints``, as the recipe's averaged.ckpt is made) and against the newest
  alone; each size of ``sizes`` below ``last`` adds the newest that many, averaged and as an ensemble;
- ``seeds=[RUN_A,RUN_B,...]``: independently seeded runs (each's averaged.ckpt, else its checkpoints/last.ckpt;
  each row named by the seed its results.json records), each alone and all as one ensemble; each size of
  ``sizes`` below their number adds an ensemble of the first that many.

Within each comparison the row with the best BLEU on the first split (val) is chosen (``select_on=NAME``: the best
value of another registered metric, in its direction: the smallest TER), and its scores on the other
splits are the ones to report (the test set is never used for a choice). Writes ``out`` (JSON: every row with
cased, lowercased and Multi30k-convention BLEU, chrF, length ratio and decode seconds per split, the choice, and
the provenance: commit, versions, machine, command) and prints the table as Markdown; docs/quality.md's
ensemble tables are generated from that file by scripts/docs_tables.py. evaluate's files and the averages go
under ``work`` (default outputs/ensemble_study/<out's stem>/, which git ignores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from study_steps import model_argument  # studies/: the steps of a multi-step study

from transformer_nmt import run_files
from transformer_nmt.checkpoint import atomic_torch_save
from transformer_nmt.inference.average import average_checkpoints, last_checkpoints
from transformer_nmt.inference.evaluate import REPORTED
from transformer_nmt.inference.evaluate import main as evaluate
from transformer_nmt.metrics import catalog
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

SELECT_ON = "bleu"  # the metric the studies choose by on val unless select_on= names another registered one
OPTIONS = {"run": None, "last": 5, "sizes": [], "seeds": [], "beam": 4, "splits": ["val", "test"],
           "threads": 0, "max_tokens": 4096, "select_on": SELECT_ON, "out": "ensemble_study.json", "work": None}
WORK = Path("outputs") / "ensemble_study"  # evaluate's files and the averages, under WORK/<out's stem> unless work=
USAGE = ("python studies/ensemble_study.py [run=RUN] [last=5] [sizes=[2,3]] [seeds=[RUN_A,RUN_B]] [beam=4] "
         "[select_on=bleu] [out=FILE.json]")
SCORES = ("bleu", "bleu_lowercase", "bleu_multi30k", "chrf", "length_ratio", "decode_seconds", "sentences",
          "threads")


def selection_metric(name: str) -> str:
    """``select_on``'s metric, checked against the registry before anything runs; a SystemExit naming the option
    and the registered names where it is none of them."""
    try:
        catalog.metric_class(name, "select_on")
    except ValueError as error:
        raise SystemExit(str(error)) from None
    return name


def metrics_argument(select_on: str) -> list[str]:
    """What evaluate is told so that it computes ``select_on`` too: nothing where its default metrics
    (evaluate.REPORTED) hold it, else ``metrics=[...]``, the defaults and it."""
    return [] if select_on in REPORTED else [f"metrics=[{','.join([*REPORTED, select_on])}]"]


def kept(scores: tuple[str, ...], select_on: str) -> tuple[str, ...]:
    """The keys a row keeps of evaluate's result: ``scores``, and the metric chosen by where it is not one of them."""
    return tuple(dict.fromkeys((*scores, select_on)))


def run_checkpoint(run: Path) -> Path:
    """A run's model: its averaged.ckpt if it has one, else checkpoints/last.ckpt."""
    for path in (run / "averaged.ckpt", run / "checkpoints" / run_files.LAST):
        if path.is_file():
            return path
    raise SystemExit(f"seeds: {run} has neither averaged.ckpt nor checkpoints/{run_files.LAST}")


def run_name(run: Path) -> str:
    """``seed N`` where the run's results.json records its seed (a training run writes it), else the directory's
    name."""
    try:
        seed = json.loads((run / "results.json").read_text(encoding="utf-8")).get("seed")
    except (OSError, ValueError, AttributeError):
        seed = None
    return f"seed {seed}" if isinstance(seed, int) else run.name


def seed_models(runs: list[Path]) -> list[tuple[str, Path]]:
    """(row name, checkpoint) of each seeded run, all found before anything is decoded; two runs of one name are
    an error naming both."""
    named = [(run_name(run), run_checkpoint(run)) for run in runs]
    names = [name for name, _ in named]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SystemExit(f"seeds: {runs[names.index(name)]} and {runs[i]} are both {name!r}: give runs of "
                             f"different seeds")
    return named


def study_sizes(sizes: list[int], largest: int) -> list[int]:
    """The sizes to compare, ascending: those of ``sizes`` below ``largest``, then ``largest``."""
    return sorted({s for s in sizes if s < largest} | {largest})


def score_row(name: str, ckpt: list[Path], options: dict, work: Path) -> dict:
    """evaluate's scores and decode seconds of one model (one path) or ensemble (several) on every split (and the
    metric ``select_on`` where evaluate's defaults lack it)."""
    row = {"name": name, "models": len(ckpt), "checkpoints": [str(p) for p in ckpt]}
    spec = model_argument(ckpt)
    out = work / name.replace(" ", "_")
    select_on = options.get("select_on", SELECT_ON)
    for split in options["splits"]:
        result = evaluate([f"ckpt={spec}", f"split={split}", f"beam={options['beam']}", f"out={out}",
                           f"threads={options['threads']}", f"max_tokens={options['max_tokens']}",
                           *metrics_argument(select_on)])
        row[split] = {key: result.get(key) for key in kept(SCORES, select_on)}
    return row


def choose_on_val(rows: list[dict], split: str, select_on: str = SELECT_ON) -> str | None:
    """The name of the row with the best value of the metric ``select_on`` on ``split`` (the first split: val), in
    its direction (catalog.best: the largest BLEU, the smallest TER); the first such row on a tie."""
    chosen = catalog.best(rows, lambda row: row[split][select_on], select_on, "select_on")
    return chosen["name"] if chosen else None


def markdown(groups: dict[str, list[dict]], chosen: dict[str, str], splits: list[str]) -> str:
    """The table printed at the end (docs/quality.md's tables are scripts/docs_tables.py's, from the JSON)."""
    header = "| comparison | model | " + " | ".join(f"{s} BLEU | {s} decode s" for s in splits) + " |"
    lines = [header, "| " + " | ".join(["---"] * (2 + 2 * len(splits))) + " |"]
    for group, rows in groups.items():
        for row in rows:
            mark = f" (chosen on {splits[0]})" if row["name"] == chosen[group] else ""
            cells = " | ".join(f"{row[s]['bleu']:.2f} | {row[s]['decode_seconds']:.1f}" for s in splits)
            lines.append(f"| {group} | {row['name']}{mark} | {cells} |")
    return "\n".join(lines)


def recent_group(run: Path, options: dict, work: Path) -> list[dict]:
    """The newest checkpoint alone, then for each size the newest that many averaged and as an ensemble."""
    recent = last_checkpoints(run / "checkpoints" / "recent", options["last"])
    rows = [score_row("newest alone", [recent[-1]], options, work)]
    for size in study_sizes(options["sizes"], len(recent)):
        newest = recent[-size:]
        averaged = work / f"average_last{size}.ckpt"
        atomic_torch_save(average_checkpoints(newest), averaged)
        rows += [score_row(f"average of {size}", [averaged], options, work),
                 score_row(f"ensemble of {size}", newest, options, work)]
    return rows


def seeds_group(models: list[tuple[str, Path]], options: dict, work: Path) -> list[dict]:
    """Each run alone, then for each size an ensemble of the first that many."""
    rows = [score_row(f"{name} alone", [path], options, work) for name, path in models]
    paths = [path for _, path in models]
    for size in study_sizes(options["sizes"], len(models)):
        rows.append(score_row(f"ensemble of {size} seeds", paths[:size], options, work))
    return rows


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if (not options["run"] and not options["seeds"]) or len(options["seeds"]) == 1:
        raise SystemExit("give run=RUN (its recent checkpoints), seeds=[RUN_A,RUN_B,...] (two runs or more), or both")
    if not all(isinstance(size, int) and size >= 2 for size in options["sizes"]):
        raise SystemExit(f"sizes={options['sizes']}: give whole numbers >= 2 (ensembles and averages of that many)")
    if not options["splits"]:
        raise SystemExit("splits=[]: give at least one split; the first is the one choices are made on (val)")
    selection_metric(options["select_on"])
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])  # the load as it starts
    models = seed_models([Path(r) for r in options["seeds"]])  # every seed's checkpoint found before decoding
    work = Path(options["work"] or WORK / Path(options["out"]).stem)
    work.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[dict]] = {}
    if options["run"]:
        groups["recent checkpoints"] = recent_group(Path(options["run"]), options, work)
    if models:
        groups["seeded runs"] = seeds_group(models, options, work)
    chosen = {group: choose_on_val(rows, options["splits"][0], options["select_on"]) for group, rows in groups.items()}
    result = {"options": options, "groups": groups, "chosen_on": options["splits"][0], "chosen": chosen,
              PROVENANCE_KEY: provenance}
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(groups, chosen, options["splits"]))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
