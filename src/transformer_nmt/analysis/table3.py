"""The Table 3 study on Multi30k: run what is missing, keep each run's small files, build the table.

    python -m transformer_nmt.table3 status [--study DIR]   # every (cell, seed) of the plan: done or missing, time left
    python -m transformer_nmt.table3 run [--max-runs N] [--cells base heads1 ...]   # the missing runs, one at a time
    python -m transformer_nmt.table3 table [--metrics bleu ...]   # STUDY/ablation.md, ablation.csv, plots

The study's kept files go to ``--study`` (default ``table3/`` in the launch directory; this repository's committed
study is ``--study docs/table3``); the runs to outputs/table3/ there.

The plan (PLAN) is Table 3 scaled down: the base (conf/experiment/ablation_base.yaml) under BASE_SEEDS seeds,
so that its run-to-run noise is measured, and every other cell, one setting changed (rows A-E; since the paper,
F: a gated feed-forward, G: the norm, H: all of them with rotary positions), under SEEDS.
A run is ``python -m transformer_nmt.train experiment=ablation_base OVERRIDES seed=K`` in
outputs/table3/CELL/seedK (a killed run resumes from its last checkpoint there, and its wall_seconds then count
the resumed part only); when it ends, its results.json (with the machine added: CPU model, cores, load average
at the start) and val_hypotheses.txt are copied to docs/table3/CELL/seedK/, and the validation references once
to docs/table3/val_references.txt.
Commit docs/table3/ after a session: runs may be spread over days and machines; ``run`` does only those whose
docs/table3 files are missing (finished runs still under outputs/table3 are collected without rerunning).
A finished run is collected only when it is the plan's: the overrides its results.json records must be the plan's
command (``planned_overrides``) and its config.yaml must have the settings the plan composes to now
(fingerprint.run_fingerprint: model, data, train, seed and what else defines a run); a kept run's overrides are
compared on every ``status``. Anything else stops with the directory and the difference named. The kept
results.json, whose presence marks a run done, is written atomically (durable.atomic_write): a killed ``status``
leaves it complete or absent, and an unreadable one (from an older, non-atomic writer) counts as missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from transformer_nmt import run_files
from transformer_nmt.durable import atomic_write
from transformer_nmt.hardware import reported_cpu_flags  # the flags every report names

RESULTS, HYPOTHESES, REFERENCES = run_files.RESULTS, run_files.HYPOTHESES, run_files.REFERENCES
BASE_SEEDS, SEEDS = (1, 2, 3, 4, 5), (1, 2)
CHECKPOINT_EVERY = 250  # optimizer steps: a killed run resumes from here (results do not change)

# (cell, Table 3 row, overrides of ablation_base): one setting changed per cell, as in the paper's rows.
PLAN = [
    ("base", "base", []),
    *((f"heads{h}", "A", [f"model.n_heads={h}"]) for h in (1, 2, 8, 16)),
    *((f"dk{d}", "B", [f"model.d_k={d}"]) for d in (8, 16)),
    *((f"layers{n}", "C", [f"ablation.n_layers={n}"]) for n in (1, 3)),
    *((f"width{d}", "C", [f"model.d_model={d}"]) for d in (64, 256)),
    *((f"ff{d}", "C", [f"model.d_ff={d}"]) for d in (256, 1024)),
    *((f"dropout{p}", "D", [f"model.dropout={p}"]) for p in ("0.0", "0.2")),
    *((f"smoothing{e}", "D", [f"train.label_smoothing={e}"]) for e in ("0.0", "0.2")),
    ("learned_positions", "E", ["model.positions=learned"]),
    # Since the paper (issue 38): rotary and no positions, a gated feed-forward at the base's parameters (d_ff 512
    # -> gated_width 344), RMSNorm, pre-norm, and the "modern" combination of them all.
    ("rotary_positions", "E", ["model.positions=rotary"]),
    ("no_positions", "E", ["model.positions=none"]),
    ("swiglu", "F", ["model.activation=swiglu", "model.d_ff=344"]),
    ("rmsnorm", "G", ["model.norm=rmsnorm"]),
    ("pre_norm", "G", ["model.norm_first=true"]),
    ("modern", "H", ["model.norm_first=true", "model.norm=rmsnorm", "model.activation=swiglu", "model.d_ff=344",
                     "model.positions=rotary"]),
]


@dataclass(frozen=True)
class Study:
    """Where the study lives: the runs in ``outputs``, the kept small files in ``docs``; runs launch in ``root``
    (the checkout, whose data/ the recipe reads)."""

    root: Path
    docs: Path
    outputs: Path

    @classmethod
    def of(cls, root: Path, docs: Path | str = "table3") -> "Study":
        """The study launched in ``root``, its kept files in ``docs`` (relative: to ``root``)."""
        return cls(root, root / docs, root / "outputs" / "table3")


def runs(cells: list[str] | None = None) -> list[tuple[str, list[str], int]]:
    """(cell, overrides, seed) of every run of the plan, base seeds first so its noise is measured early."""
    return [(cell, overrides, seed) for cell, _, overrides in PLAN if not cells or cell in cells
            for seed in (BASE_SEEDS if cell == "base" else SEEDS)]


def planned_overrides(overrides: list[str], seed: int) -> list[str]:
    """The train command's overrides for a run of the plan, in the order its results.json records them (the
    ``hydra.*`` ones, such as its run dir, are not recorded)."""
    return ["experiment=ablation_base", *overrides, f"seed={seed}",
            f"checkpoint.every_n_train_steps={CHECKPOINT_EVERY}"]


def planned_fingerprint(overrides: list[str], seed: int) -> dict:
    """fingerprint.results_fingerprint of the config the plan's command composes to, now: the whole config but
    what changes neither training nor results, the trainer's settings included. Where the plan leaves the precision
    to the machine (``trainer.precision=auto``), the precision is left out: a run trained on another host in what
    auto gave there is still the plan's."""
    from hydra import compose, initialize_config_dir

    from transformer_nmt.conf import CONF_DIR
    from transformer_nmt.training.config import register_configs
    from transformer_nmt.training.fingerprint import PRECISION, results_fingerprint
    from transformer_nmt.training.resolvers import register_resolvers

    register_configs()
    register_resolvers()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=planned_overrides(overrides, seed))
    planned = results_fingerprint(cfg)
    if str(cfg.trainer.get("precision", "auto")) == "auto":
        planned.pop(PRECISION)
    return planned


def read_results(path: Path) -> dict | None:
    """A results.json, or None (with a warning) when it is not complete JSON: a writer killed mid-write."""
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        print(f"warning: {path} is not readable JSON ({error}): counted as missing", file=sys.stderr)
        return None
    return results if isinstance(results, dict) else None


def check_overrides(results: dict, path: Path, overrides: list[str], seed: int, fix: str) -> None:
    """Stop when ``results`` (read from ``path``) records other overrides than the plan's for (cell, seed)."""
    planned = planned_overrides(overrides, seed)
    if results.get("overrides") != planned:
        raise SystemExit(f"{path} is not the plan's run: it ran with the overrides\n  "
                         f"{' '.join(results.get('overrides') or ['(none recorded)'])}\nbut the plan's command for "
                         f"this directory gives\n  {' '.join(planned)}\n{fix}")


def check_config(run_dir: Path, results: dict, overrides: list[str], seed: int) -> None:
    """Stop when the finished run (its ``results``, read from ``run_dir``) has other settings than the plan composes
    to now: its results fingerprint (results.json's, with the precision it trained in; for an older run, its
    config.yaml's) against the plan's (``planned_fingerprint``)."""
    from transformer_nmt.training.fingerprint import PRECISION, differences, saved_results_fingerprint

    config = run_dir / run_files.CONFIG
    if not config.is_file():
        raise SystemExit(f"{run_dir} holds {RESULTS} but no {run_files.CONFIG}: its settings cannot be compared with "
                         f"the plan's; delete {run_dir} to run it again")
    planned = planned_fingerprint(overrides, seed)
    saved = saved_results_fingerprint(results, config)
    if PRECISION not in planned:  # auto: whatever the run's machine gave
        saved = {k: v for k, v in saved.items() if k != PRECISION}
    changed = differences(saved, planned)
    if changed:
        lines = "\n".join(f"  {key}: {old} there, {new} in the plan" for key, (old, new) in changed.items())
        raise SystemExit(f"{run_dir} ran with other settings than the plan composes to now:\n{lines}\nIts results "
                         f"are not the plan's: delete {run_dir} to run it under the plan (or restore the plan)")


def machine() -> dict:
    """Where a run ran: CPU model, cores, and the load average as it started (a loaded machine runs slower)."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"cpu_model": model, "cpus": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 2)}


def collect(study: Study, cell: str, seed: int, started_on: dict | None = None,
            overrides: list[str] | None = None) -> bool:
    """Copy a finished run's small files from outputs/ to docs/table3 once it is checked to be the plan's
    (``overrides``: the cell's, None: the plan's for ``cell``); True if the run is (now) in docs."""
    if overrides is None:
        overrides = next(o for c, _, o in PLAN if c == cell)
    docs = study.docs
    run_dir, kept = study.outputs / cell / f"seed{seed}", docs / cell / f"seed{seed}"
    if (kept / RESULTS).is_file():
        results = read_results(kept / RESULTS)
        if results is not None:
            check_overrides(results, kept / RESULTS, overrides, seed,
                            f"The study's kept run is not the plan's: restore the plan, or delete {kept} to run it")
            return True
    if not (run_dir / RESULTS).is_file():
        return False
    results = read_results(run_dir / RESULTS)
    if results is None:
        return False
    check_overrides(results, run_dir / RESULTS, overrides, seed,
                    f"Its results are not the plan's: delete {run_dir} to run it under the plan")
    check_config(run_dir, results, overrides, seed)
    kept.mkdir(parents=True, exist_ok=True)
    results["machine"] = started_on or {**machine(), "load_average_1min": None}  # collected later: load unknown
    if (run_dir / HYPOTHESES).is_file():
        copy_atomically(run_dir / HYPOTHESES, kept / HYPOTHESES)
    references = run_dir / REFERENCES
    if references.is_file():
        if not (docs / REFERENCES).is_file():
            copy_atomically(references, docs / REFERENCES)
        elif (docs / REFERENCES).read_bytes() != references.read_bytes():
            raise SystemExit(f"{references} differs from {docs / REFERENCES}: the study needs one validation set")
    text = json.dumps(results, indent=2) + "\n"
    atomic_write(kept / RESULTS, lambda f: f.write(text.encode()))  # last, and whole: its presence means "done"
    return True


def copy_atomically(source: Path, destination: Path) -> None:
    data = source.read_bytes()
    atomic_write(destination, lambda f: f.write(data))


def done_minutes(study: Study) -> list[float]:
    return [r["wall_seconds"] / 60 for r in map(read_results, study.docs.glob(f"*/seed*/{RESULTS}")) if r]


def status(study: Study, cells: list[str] | None = None) -> list[tuple[str, list[str], int]]:
    """Print the plan, done and missing; returns the missing runs."""
    missing = [(cell, overrides, seed) for cell, overrides, seed in runs(cells)
               if not collect(study, cell, seed, overrides=overrides)]
    minutes = done_minutes(study)
    per_run = statistics.median(minutes) if minutes else None  # the median: runs on a loaded machine are outliers
    for cell, row, overrides in PLAN:
        if cells and cell not in cells:
            continue
        seeds = BASE_SEEDS if cell == "base" else SEEDS
        todo = [seed for c, _, seed in missing if c == cell]
        print(f"({row:>4}) {cell:<18} {' '.join(overrides) or '(ablation_base)':<32} seeds "
              f"{' '.join(map(str, seeds))}: " + (f"missing {' '.join(map(str, todo))}" if todo else "done"))
    total = len(runs(cells))
    left = f", about {len(missing) * per_run / 60:.1f} h left at {per_run:.1f} min a run (median)" if per_run else ""
    print(f"{total - len(missing)} of {total} runs done ({sum(minutes) / 60:.1f} h of wall time so far){left}")
    return missing


def run(study: Study, cells: list[str] | None, max_runs: int | None) -> None:
    for number, (cell, overrides, seed) in enumerate(status(study, cells)):
        if max_runs is not None and number >= max_runs:
            break
        run_dir = study.outputs / cell / f"seed{seed}"
        started_on = machine()
        command = [sys.executable, "-m", "transformer_nmt.train", *planned_overrides(overrides, seed),
                   f"hydra.run.dir={run_dir}"]
        print(f"\n[{time.strftime('%H:%M:%S')}] {cell} seed {seed}: {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        subprocess.run(command, cwd=study.root, check=True)
        collect(study, cell, seed, started_on, overrides)
        print(f"[{time.strftime('%H:%M:%S')}] {cell} seed {seed} done in {(time.perf_counter() - start) / 60:.1f} "
              f"min (load average at start {started_on['load_average_1min']})", flush=True)


def table(study: Study, metrics: list[str] | None = None) -> None:
    """Build docs/table3/ablation.md (+ csv, plots) from the kept runs, for ``metrics`` (registered names; None:
    the summary's default, BLEU); add how, where and how long they ran."""
    from transformer_nmt.analysis.ablation import DEFAULT_METRICS, summarize

    docs = study.docs
    text = summarize([docs], docs, metrics=metrics or DEFAULT_METRICS)
    results = [json.loads(p.read_text()) for p in sorted(docs.glob(f"*/seed*/{RESULTS}"))]
    setups = sorted({(r.get("precision"), " ".join(reported_cpu_flags(r.get("cpu_flags", []))),
                      r.get("machine", {}).get("cpu_model"), r.get("torch_threads")) for r in results}, key=str)
    loads = [r["machine"]["load_average_1min"] for r in results
             if r.get("machine", {}).get("load_average_1min") is not None]
    lines = [f"\n{len(results)} runs of {len(runs())} planned, {sum(r['wall_seconds'] for r in results) / 3600:.2f} h "
             f"of wall time in all (each run: data, training, validation)."]
    lines += [f"Ran in precision {p}, on {cpu} (flags {flags}), {threads} torch threads." for p, flags, cpu, threads
              in setups]
    if loads:
        cpus = results[0]["machine"]["cpus"]
        lines.append(f"Load average (1 min) as runs started: {min(loads)}-{max(loads)} on {cpus} cores: runs that "
                     f"started on a loaded machine took longer than on quiet cores.")
    text += "\n".join(lines) + "\n"
    (docs / "ablation.md").write_text(text, encoding="utf-8")
    print(text, end="")


def main(argv: list[str], root: Path) -> None:
    """The command line of ``python -m transformer_nmt.table3``, launched in ``root``."""
    from transformer_nmt.analysis.ablation import add_metrics_option, metrics
    parser = argparse.ArgumentParser(prog="python -m transformer_nmt.table3", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("status", "run", "table"))
    parser.add_argument("--study", default="table3", help="where the study's kept files go (relative: to the launch "
                                                           "directory); this repository's: docs/table3")
    parser.add_argument("--cells", nargs="+", choices=[cell for cell, _, _ in PLAN], help="only these cells")
    parser.add_argument("--max-runs", type=int, help="run: stop after this many runs")
    add_metrics_option(parser)
    args = parser.parse_args(argv)
    chosen = metrics(parser, args)
    study = Study.of(root, args.study)
    study.docs.mkdir(parents=True, exist_ok=True)
    if args.command == "status":
        status(study, args.cells)
    elif args.command == "run":
        run(study, args.cells, args.max_runs)
    else:
        table(study, chosen)
