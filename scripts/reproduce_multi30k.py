"""The Multi30k headline in one command: train the CPU recipe, average, choose on val, score on test.

    python scripts/reproduce_multi30k.py [run_id=NAME] [KEY=VALUE ...]
    python scripts/reproduce_multi30k.py train=false run_id=NAME [KEY=VALUE ...]   # steps 2-4 of a trained run
    python scripts/reproduce_multi30k.py train=false run_dir=RUN                   # the same, by its directory

KEY=VALUE pairs other than ``train`` and ``run_dir`` go to training, after ``experiment=multi30k_cpu``
(e.g. ``data.src_lang=de data.tgt_lang=en``). The run directory is the one ``transformer_nmt.train`` picks,
``outputs/multi30k_cpu_SRC_TGT/NAME`` (NAME: ``run_id``, default the launch time); running again with the
same NAME resumes its training (``ckpt_path=auto``). Each step is a separate process, timed:

1. train (data preparation, fit, and the recipe's own greedy test of its best checkpoint);
2. average the checkpoints ``checkpoints/recent`` keeps (the run's ``checkpoint.recent.keep``) into
   ``averaged.ckpt``;
3. the averaged and the last checkpoint on val with ``evaluate``'s beam (4): the higher val BLEU is the
   chosen checkpoint (the test set is never used for a choice);
4. the chosen checkpoint on test with that beam, and greedy (beam 1) on val and on test.

Prints the CPU flags, the time of each step, greedy validation BLEU against minutes since the run's first
TensorBoard event file (written as training starts, after data preparation; a resumed run's minutes include
the time between its launches), and the scores with length ratio and brevity penalty; writes them all to
``RUN/reproduce.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from transformer_nmt.precision import REPORTED_CPU_FLAGS, cpu_flags

ROOT = Path(__file__).resolve().parent.parent


def run_step(name: str, args: list[str], timings: dict) -> None:
    """Run ``python -m ARGS`` from the repository root, fail loudly, record its wall time in minutes."""
    print(f"\n=== {name}: {' '.join(args)}", flush=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=True)
    timings[name] = round((time.perf_counter() - started) / 60, 2)


def run_directory(train_overrides: list[str]) -> Path:
    """The directory ``python -m transformer_nmt.train *train_overrides`` runs in (its ``hydra.run.dir``)."""
    from hydra import compose, initialize_config_dir

    from transformer_nmt.train import CONF_DIR  # also registers train_defaults and the ${run_name:} resolver

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=train_overrides, return_hydra_config=True)
    return ROOT / cfg.hydra.run.dir


def evaluate(ckpt: Path, split: str, beam: int, out: Path, timings: dict) -> dict:
    name = f"{split}_{ckpt.stem}_beam{beam}"
    run_step(f"evaluate {name}", ["transformer_nmt.evaluate", f"ckpt={ckpt}", f"split={split}", f"beam={beam}",
                                  f"out={out}", f"name={name}"], timings)
    return json.loads((out / f"{name}.json").read_text())


def validation_curve(run_dir: Path) -> list[tuple[float, int, float]]:
    """(minutes since the first event file's creation, optimizer step, greedy val BLEU) of every validation,
    from the run's TensorBoard events (files named events.out.tfevents.SECONDS.HOST...)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    if not files:
        return []
    launched = min(int(f.name.split(".")[3]) for f in files)
    curve = []
    for events in files:
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if "val/bleu" in accumulator.Tags()["scalars"]:
            curve += [(round((e.wall_time - launched) / 60, 1), e.step, round(e.value, 2))
                      for e in accumulator.Scalars("val/bleu")]
    return sorted(curve)


def main(argv: list[str]) -> dict:
    own = {"run_dir": None, "train": "true"}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in own:
            own[key] = value
    if own["train"] not in ("true", "false"):
        sys.exit(f"train={own['train']!r}: use true or false")
    from transformer_nmt.launch import run_name
    from transformer_nmt.translate import OPTIONS

    overrides = [a for a in argv if a.partition("=")[0] not in own]
    if not any(a.startswith("run_id=") for a in overrides):
        overrides.append(f"run_id={run_name(None)}")  # fixed here, so that this script knows the run dir
    train_overrides = ["experiment=multi30k_cpu", *overrides]
    run_dir = Path(own["run_dir"]).resolve() if own["run_dir"] else run_directory(train_overrides)
    eval_dir = run_dir / "eval"
    timings: dict[str, float] = {}

    if own["train"] == "true":
        run_step("train", ["transformer_nmt.train", *train_overrides, f"hydra.run.dir={run_dir}"], timings)
    elif not (run_dir / "checkpoints" / "last.ckpt").is_file():
        sys.exit(f"train=false: {run_dir / 'checkpoints' / 'last.ckpt'} does not exist; give the run_id "
                 f"(and overrides) or run_dir of a trained run")
    keep = OmegaConf.load(run_dir / "config.yaml").checkpoint.recent.keep
    beam = OPTIONS["beam"]
    averaged, last = run_dir / "averaged.ckpt", run_dir / "checkpoints" / "last.ckpt"
    run_step("average", ["transformer_nmt.average", f"dir={run_dir / 'checkpoints' / 'recent'}", f"last={keep}",
                         f"output={averaged}"], timings)
    val = {ckpt.stem: evaluate(ckpt, "val", beam, eval_dir, timings) for ckpt in (averaged, last)}
    chosen = max((averaged, last), key=lambda c: val[c.stem]["bleu"])  # ties: the averaged one (first)
    scores = {
        ("val", beam): val[chosen.stem],
        ("test", beam): evaluate(chosen, "test", beam, eval_dir, timings),
        ("val", 1): evaluate(chosen, "val", 1, eval_dir, timings),
        ("test", 1): evaluate(chosen, "test", 1, eval_dir, timings),
    }
    curve = validation_curve(run_dir)
    report = {
        "run_dir": str(run_dir), "overrides": overrides, "cpu_flags": [f for f in REPORTED_CPU_FLAGS if f in cpu_flags()],
        "train_minutes": timings.get("train"), "total_minutes": round(sum(timings.values()), 2), "timings": timings,
        "val_bleu_chosen_on": {stem: s["bleu"] for stem, s in val.items()}, "chosen": chosen.name,
        "scores": {f"{split}_beam{width}": {k: s[k] for k in ("bleu", "bleu_lowercase", "chrf", "length_ratio", "bp")}
                   for (split, width), s in scores.items()},
        "val_curve": [{"minutes": m, "step": step, "greedy_val_bleu": b} for m, step, b in curve],
    }
    (run_dir / "reproduce.json").write_text(json.dumps(report, indent=2) + "\n")

    print(f"\nCPU flags: {' '.join(report['cpu_flags'])}; run dir {run_dir}")
    print("\n| step | minutes |\n| --- | --- |")
    for name, minutes in timings.items():
        print(f"| {name} | {minutes} |")
    print("\n| minutes | step | greedy val BLEU |\n| --- | --- | --- |")
    for minutes, step, bleu in curve:
        print(f"| {minutes} | {step} | {bleu} |")
    print(f"\nval BLEU, beam {beam}: averaged {val['averaged']['bleu']}, last {val['last']['bleu']} "
          f"-> chosen {chosen.name}")
    print("\n| split | decoder | BLEU | BLEU lowercased | chrF | length ratio | BP |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (split, width), s in scores.items():
        decoder = "greedy" if width == 1 else f"beam {width}"
        print(f"| {split} | {decoder} | {s['bleu']:.2f} | {s['bleu_lowercase']:.2f} | {s['chrf']:.2f} | "
              f"{s['length_ratio']:.3f} | {s['bp']:.3f} |")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
