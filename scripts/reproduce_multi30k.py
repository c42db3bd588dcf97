"""The Multi30k headline in one command: train the CPU recipe, average, choose on val, score on test.

    python scripts/reproduce_multi30k.py [run_id=NAME] [KEY=VALUE ...]
    python scripts/reproduce_multi30k.py train=false run_dir=RUN     # steps 2-4 on a run trained before

KEY=VALUE pairs other than ``run_id``, ``run_dir`` and ``train`` go to training (``experiment=multi30k_cpu`` is always given), e.g.
``data.src_lang=de data.tgt_lang=en``. The run lives in ``outputs/multi30k_headline/NAME`` (default: the
launch time, or ``run_dir=DIR``); running again with the same NAME resumes its training (``ckpt_path=auto``). Each step is a
separate process, timed:

1. train (data preparation, fit, and the recipe's own greedy test of its best checkpoint);
2. average the newest 5 checkpoints of ``checkpoints/recent`` into ``averaged.ckpt``;
3. the averaged and the last checkpoint on val, beam 4: the higher val BLEU is the chosen checkpoint (the
   test set is never used for a choice);
4. the chosen checkpoint on test with beam 4, and greedy (beam 1) on val and on test.

Prints the CPU flags, the time of each step, greedy validation BLEU against minutes since the launch (from
the run's TensorBoard events), and the scores with length ratio and brevity penalty; writes them all to
``RUN/reproduce.json``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> list[str]:
    """The flags that decide the CPU's precision and speed (as ``lscpu | grep -o 'avx512_bf16|amx_bf16|avx2'``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return [platform.processor() or "unknown"]
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return [f for f in ("avx2", *BF16_FLAGS) if f in flags]


def run_step(name: str, args: list[str], timings: dict) -> None:
    """Run ``python -m ARGS`` from the repository root, fail loudly, record its wall time in minutes."""
    print(f"\n=== {name}: {' '.join(args)}", flush=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=True)
    timings[name] = round((time.perf_counter() - started) / 60, 2)


def evaluate(ckpt: Path, split: str, beam: int, out: Path, timings: dict) -> dict:
    name = f"{split}_{ckpt.stem}_beam{beam}"
    run_step(f"evaluate {name}", ["transformer_nmt.evaluate", f"ckpt={ckpt}", f"split={split}", f"beam={beam}",
                                  f"out={out}", f"name={name}"], timings)
    return json.loads((out / f"{name}.json").read_text())


def validation_curve(run_dir: Path, launched: float) -> list[tuple[float, int, float]]:
    """(minutes since ``launched``, optimizer step, greedy val BLEU) of every validation, from TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curve = []
    for events in sorted((run_dir / "tensorboard").rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if "val/bleu" in accumulator.Tags()["scalars"]:
            curve += [(round((e.wall_time - launched) / 60, 1), e.step, round(e.value, 2))
                      for e in accumulator.Scalars("val/bleu")]
    return sorted(curve)


def main(argv: list[str]) -> dict:
    own = {"run_id": None, "run_dir": None, "train": "true"}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in own:
            own[key] = value
    if own["train"] not in ("true", "false"):
        sys.exit(f"train={own['train']!r}: use true or false")
    overrides = [a for a in argv if a.partition("=")[0] not in own]
    run_id = own["run_id"] or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    run_dir = Path(own["run_dir"] or ROOT / "outputs" / "multi30k_headline" / run_id).resolve()
    eval_dir = run_dir / "eval"
    timings: dict[str, float] = {}

    if own["train"] == "true":
        launched = time.time()
        run_step("train", ["transformer_nmt.train", "experiment=multi30k_cpu", f"hydra.run.dir={run_dir}",
                           *overrides], timings)
    elif not (run_dir / "checkpoints" / "last.ckpt").is_file():
        sys.exit(f"train=false: {run_dir / 'checkpoints' / 'last.ckpt'} does not exist; give the run_dir of a trained run")
    else:
        launched = (run_dir / "config.yaml").stat().st_mtime  # written as the training run started
    averaged, last = run_dir / "averaged.ckpt", run_dir / "checkpoints" / "last.ckpt"
    run_step("average", ["transformer_nmt.average", f"dir={run_dir / 'checkpoints' / 'recent'}", "last=5",
                         f"output={averaged}"], timings)
    val = {ckpt.stem: evaluate(ckpt, "val", 4, eval_dir, timings) for ckpt in (averaged, last)}
    chosen = max((averaged, last), key=lambda c: val[c.stem]["bleu"])  # ties: the averaged one (first)
    scores = {
        ("val", 4): val[chosen.stem],
        ("test", 4): evaluate(chosen, "test", 4, eval_dir, timings),
        ("val", 1): evaluate(chosen, "val", 1, eval_dir, timings),
        ("test", 1): evaluate(chosen, "test", 1, eval_dir, timings),
    }
    curve = validation_curve(run_dir, launched)
    report = {
        "run_dir": str(run_dir), "overrides": overrides, "cpu_flags": cpu_flags(),
        "train_minutes": timings.get("train"), "total_minutes": round(sum(timings.values()), 2), "timings": timings,
        "val_bleu_beam4": {stem: s["bleu"] for stem, s in val.items()}, "chosen": chosen.name,
        "scores": {f"{split}_beam{beam}": {k: s[k] for k in ("bleu", "bleu_lowercase", "chrf", "length_ratio", "bp")}
                   for (split, beam), s in scores.items()},
        "val_curve": [{"minutes": m, "step": step, "greedy_val_bleu": b} for m, step, b in curve],
    }
    (run_dir / "reproduce.json").write_text(json.dumps(report, indent=2) + "\n")

    print(f"\nCPU flags: {' '.join(report['cpu_flags'])}; run dir {run_dir}")
    print("\n| step | minutes |\n| --- | --- |")
    for name, minutes in timings.items():
        print(f"| {name} | {minutes} |")
    print("\n| minutes since launch | step | greedy val BLEU |\n| --- | --- | --- |")
    for minutes, step, bleu in curve:
        print(f"| {minutes} | {step} | {bleu} |")
    print(f"\nval BLEU, beam 4: averaged {val['averaged']['bleu']}, last {val['last']['bleu']} -> chosen {chosen.name}")
    print("\n| split | decoder | BLEU | BLEU lowercased | chrF | length ratio | BP |\n| --- | --- | --- | --- | --- | --- | --- |")
    for (split, beam), s in scores.items():
        decoder = "greedy" if beam == 1 else f"beam {beam}"
        print(f"| {split} | {decoder} | {s['bleu']:.2f} | {s['bleu_lowercase']:.2f} | {s['chrf']:.2f} | "
              f"{s['length_ratio']:.3f} | {s['bp']:.3f} |")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
