"""The spread of the permutation task's AER (transformer_nmt.alignment_aer) over what a CPU may change: the seed,
the thread count and the instruction set of the kernels. tests/test_alignment.py's bound on the trained model's
AER is set from this file, not from one run on one machine.

    python scripts/alignment_aer_spread.py --seeds 0-9 --json docs/alignment/aer_spread.json

Each (instruction set, threads) pair runs in a fresh process (the variables that cap the instruction set are read
when torch loads): ``native`` is what torch picks on this host; ``avx2`` sets ``ATEN_CPU_CAPABILITY=avx2``,
``MKL_ENABLE_INSTRUCTIONS=AVX2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``, the code path of an AVX2-only host (as in
docs/benchmarks/fp32_isa/). Every run trains the task's recipe with one seed and scores the default alignments
(output position) and the input position of every decoder layer. Prints the worst of each column; ``--json``
writes every table with the provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ISAS = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                               "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def seeds_of(text: str) -> list[int]:
    """``0-9`` or ``0,3,5``: the seeds."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def child(seeds: list[int], threads: int) -> None:
    """In the measuring process: one JSON line per seed, {"seed", "table": {"LAYER POSITION": AER}}."""
    import torch

    from transformer_nmt.analysis import alignment_aer as task

    torch.set_num_threads(threads)
    for seed in seeds:
        table = task.aer_table(task.train_permutation_model(seed=seed))
        print(json.dumps({"seed": seed, "table": {f"{layer} {position}": aer
                                                  for (layer, position), aer in table.items()}}), flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-9", help="seeds of the recipe, 0-9 or 0,3,5")
    parser.add_argument("--threads", default="1,2", help="torch thread counts")
    parser.add_argument("--isas", default="native,avx2", help=f"instruction sets, of {sorted(ISAS)}")
    parser.add_argument("--json", type=Path, help="write every run's table here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seeds, threads = seeds_of(args.seeds), [int(t) for t in args.threads.split(",")]
    if args.child:
        child(seeds, threads[0])
        return {}
    from transformer_nmt.analysis.alignment_aer import MODEL, PERMUTATION, RECIPE
    from transformer_nmt.provenance import collect

    runs = []
    for isa in args.isas.split(","):
        for n in threads:
            env = {**os.environ, **ISAS[isa]}
            command = [sys.executable, __file__, "--child", "--seeds", args.seeds, "--threads", str(n)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            for line in done.stdout.splitlines():
                run = {"isa": isa, "threads": n, **json.loads(line)}
                runs.append(run)
                print(json.dumps(run), file=sys.stderr)
    columns = sorted({key for run in runs for key in run["table"]})
    worst = {key: max(run["table"][key] for run in runs) for key in columns}
    best = {key: min(run["table"][key] for run in runs) for key in columns}
    for key in columns:
        print(f"{key}: AER {best[key]:.3f} .. {worst[key]:.3f} over {len(runs)} runs")
    result = {"command": " ".join(["python", "scripts/alignment_aer_spread.py", *(argv or sys.argv[1:])]),
              "isas": {isa: ISAS[isa] for isa in args.isas.split(",")}, "recipe": RECIPE, "model": MODEL,
              "permutation": list(PERMUTATION), "runs": runs, "best": best, "worst": worst,
              "provenance": collect()}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
