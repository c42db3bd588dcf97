"""The step cost of the architecture switches: the Table 3 base against each cell of the rows since the paper
(rotary and no positions, SwiGLU at equal parameters, RMSNorm, pre-norm, all of them), side by side in one process.

    python benchmarks/benchmark_architectures.py                   # every cell of rows E-H, 20 rounds
    python benchmarks/benchmark_architectures.py --cells rmsnorm modern --rounds 40 --json out.json

Each model is composed as the study runs it (``experiment=ablation_base`` with the cell's overrides from
analysis/table3.py's PLAN; the vocabulary of data.vocab_size), built from one seed, and takes a training step
(forward in bf16 autocast where the CPU has native bf16, else fp32; the label-smoothed loss; backward; Adam) on the
same batch of Multi30k-sized random ids. Every round steps each model once, in an order that rotates; the table
gives each cell's parameters, its median target tokens/s, and the median of its per-round ratios to the base
(above 1: faster than the base).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
from recipe import small_recipe, train_step  # benchmarks/

from transformer_nmt.analysis.table3 import PLAN
from transformer_nmt.hardware import cpu_native_bf16, reported_cpu_flags
from transformer_nmt.model.transformer import Transformer, TransformerConfig

ROWS = ("E", "F", "G", "H")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="*", default=None, help="cells of the plan (default: rows E-H)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--length", type=int, default=16, help="tokens per sentence (Multi30k's mean is ~15)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the table's rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bf16 = cpu_native_bf16()[0]
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    cells = [("base", [])] + [(cell, overrides) for cell, row, overrides in PLAN
                              if (cell in args.cells if args.cells else row in ROWS)]
    models, optimizers, configs = {}, {}, {}
    for cell, overrides in cells:
        configs[cell] = small_recipe("ablation_base", tuple(overrides))[0]  # as the study composes it
        torch.manual_seed(0)
        models[cell] = Transformer(TransformerConfig(**configs[cell])).train()
        optimizers[cell] = torch.optim.Adam(models[cell].parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    vocab = configs["base"]["vocab_size"]
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (args.batch, args.length), generator=generator)
    tgt = torch.randint(4, vocab, (args.batch, args.length + 1), generator=generator)
    names = list(models)
    for name in names:  # warm-up
        train_step(models[name], optimizers[name], src, tgt, autocast)
    seconds = {name: [] for name in names}
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            train_step(models[name], optimizers[name], src, tgt, autocast)
            seconds[name].append(time.perf_counter() - start)

    tokens = args.batch * args.length  # target tokens per step
    rows = []
    for name in names:
        ratios = [b / s for b, s in zip(seconds["base"], seconds[name])]
        changed = {k: v for k, v in configs[name].items() if configs["base"].get(k) != v}
        rows.append({"cell": name, "changes": changed, "parameters": models[name].num_parameters(),
                     "tokens_per_sec": round(tokens / statistics.median(seconds[name]), 1),
                     "vs_base": round(statistics.median(ratios), 3)})
    print(f"\n### Training step of the Table 3 base and the cells of rows E-H, {args.rounds} rounds, "
          f"{'bf16 autocast' if bf16 else 'fp32'}, batch {args.batch} x {args.length} target tokens, {args.threads} "
          f"thread(s), torch {torch.__version__}; CPU flags: {' '.join(reported_cpu_flags())}\n")
    print("| cell | changes | parameters | target tokens/s | vs base (median of per-round ratios) |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        changes = ", ".join(f"{k} {v}" for k, v in row["changes"].items()) or "-"
        print(f"| {row['cell']} | {changes} | {row['parameters']:,} | {row['tokens_per_sec']:,.0f} | "
              f"{row['vs_base']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "batch": [args.batch, args.length], "threads": args.threads,
                       "precision": "bf16 autocast" if bf16 else "fp32", "torch": torch.__version__,
                       "cpu_flags": reported_cpu_flags(), "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
