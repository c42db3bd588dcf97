"""The recipe's training throughput at this checkout against another commit's, side by side: the same command
(``python -m transformer_nmt.train experiment=multi30k_cpu`` for ``--steps`` updates, no validation, no checkpoints
kept) run from each tree in turn, alternating (each side first in every other round), so that a drifting load hits
both.

    python benchmarks/benchmark_recipe_versions.py --other 7063122^ --steps 60 --rounds 3 --json versions.json

The other commit is checked out into a temporary git worktree and run from there (its own package, configs and
data cache); each side's first round also builds its data cache, which the measure leaves out. Measure: results.json's
target tokens per second (every optimizer step but the first, step to step, data included), per round; the table
gives each side's median and the median of the per-round ratios (this checkout over the other). ``--precision``
(default auto: what the recipe trains in on this CPU) goes to both. Prints the CPU flags; ``--json`` writes the raw
numbers with the provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OVERRIDES = ["experiment=multi30k_cpu", "trainer.max_time=null", "train.val_bleu_max_sentences=0",
             "trainer.limit_val_batches=0", "run_test=false", "validate_at_end=false",
             "attention_maps.every_n_validations=0", "checkpoint.save_top_k=0", "checkpoint.recent.keep=0",
             "trainer.enable_progress_bar=false"]


def train(tree: Path, run_dir: Path, steps: int, precision: str, threads: int) -> dict:
    """The recipe for ``steps`` updates, run from ``tree`` (its src/ first on the path): its results.json."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(tree / "src")}
    done = subprocess.run([sys.executable, "-m", "transformer_nmt.train", *OVERRIDES, f"trainer.max_steps={steps}",
                           f"trainer.precision={precision}", f"hydra.run.dir={run_dir}", "ckpt_path=null"],
                          env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"training from {tree} failed (exit status {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((run_dir / "results.json").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", required=True, help="the commit to compare with (anything git rev-parse takes)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from transformer_nmt.provenance import PROVENANCE_KEY
    from transformer_nmt.provenance import collect as collect_provenance

    other = subprocess.run(["git", "rev-parse", "--short", args.other], cwd=ROOT, capture_output=True, text=True)
    if other.returncode != 0:
        raise SystemExit(f"--other {args.other!r}: {other.stderr.strip()}")
    other = other.stdout.strip()
    record = {"options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    report = {"other": other, "steps": args.steps, "precision": args.precision, "threads": args.threads,
              PROVENANCE_KEY: collect_provenance(record), "rounds": []}
    with tempfile.TemporaryDirectory(prefix="recipe_versions_") as tmp:
        tree = Path(tmp) / "other"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), other], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for r in range(args.rounds):
                runs = {}
                for side in (("this", "other") if r % 2 == 0 else ("other", "this")):  # each goes first in turn
                    runs[side] = train(ROOT if side == "this" else tree, Path(tmp) / f"{side}_{r}", args.steps,
                                       args.precision, args.threads)
                this, then = runs["this"], runs["other"]
                report["rounds"].append({"this": this, "other": then, "load": os.getloadavg()})
                print(f"round {r}: this checkout {this['train_tgt_tokens_per_sec']:.0f} tgt tok/s, {other} "
                      f"{then['train_tgt_tokens_per_sec']:.0f} ({this['precision']}, {then['precision']})", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    ratios = [r["this"]["train_tgt_tokens_per_sec"] / r["other"]["train_tgt_tokens_per_sec"] for r in report["rounds"]]
    report["median_ratio"] = statistics.median(ratios)
    flags = " ".join(report[PROVENANCE_KEY]["cpu_flags"] or [])
    print(f"\nCPU flags: {flags}; {args.threads} threads; precision {args.precision}; {args.steps} steps x "
          f"{args.rounds} rounds\n")
    print("| tree | target tokens/s (median) | this / other (median of rounds) |")
    print("| --- | --- | --- |")
    print(f"| this checkout ({(report[PROVENANCE_KEY]['git']['commit'] or '?')[:7]}) | "
          f"{statistics.median(r['this']['train_tgt_tokens_per_sec'] for r in report['rounds']):,.0f} | "
          f"{report['median_ratio']:.3f} ({', '.join(f'{x:.3f}' for x in ratios)}) |")
    print(f"| {other} | {statistics.median(r['other']['train_tgt_tokens_per_sec'] for r in report['rounds']):,.0f} | |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
