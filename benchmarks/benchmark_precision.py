"""Training-step time in 32-true against bf16-mixed on this machine's CPU (what trainer.precision=auto decides).

    python benchmarks/benchmark_precision.py [--steps 3] [--batch 64] [--length 20]

The small model (conf/model/small.yaml: d_model 256, 4 heads, 3+3 layers, d_ff 1024; vocabulary 8000) takes
forward, label-smoothed loss, backward and an Adam step on one batch, alternating one step in fp32 and one in
bf16 autocast (after one warm-up step of each), on one thread. Prints a table with the CPU's bf16 flags, the
median step time of each, the median of the per-pair ratios, and what precision=auto picks here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from recipe import recipe_adam, small_recipe  # benchmarks/

from transformer_nmt.hardware import cpu_native_bf16
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.provenance import provenance_line
from transformer_nmt.training.loss import label_smoothed_cross_entropy
from transformer_nmt.training.precision import resolve_precision

SMALL = small_recipe()[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed steps of each precision")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(provenance_line({"args": vars(args)}))
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**SMALL))
    optimizer = recipe_adam(model.parameters())
    src = torch.randint(4, SMALL["vocab_size"], (args.batch, args.length))
    tgt = torch.randint(4, SMALL["vocab_size"], (args.batch, args.length + 1))

    def step(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(src, tgt[:, :-1])
            loss = label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, 0, overwrite_logits=True)[0]
        optimizer.zero_grad(set_to_none=True)
        (loss / 1000).backward()
        optimizer.step()
        return time.perf_counter() - start

    times = {False: [], True: []}
    for i in range(args.steps + 1):
        for bf16 in (False, True):
            seconds = step(bf16)
            if i:
                times[bf16].append(seconds)
    ratio = statistics.median(b / f for f, b in zip(times[False], times[True]))
    flags = (cpu_native_bf16()[1] or "none").split(", ")  # the flags (or TRANSFORMER_NMT_CPU_BF16) auto reads
    chosen, why = resolve_precision("auto", "cpu")
    print(f"\n### Training step, small model, batch {args.batch} x {args.length} target tokens, 1 thread, "
          f"torch {torch.__version__}; native bf16 flags: {', '.join(flags)}\n")
    print("| precision | seconds per step (median) | vs 32-true |")
    print("| --- | --- | --- |")
    print(f"| 32-true | {statistics.median(times[False]):.2f} | 1.0x |")
    print(f"| bf16-mixed | {statistics.median(times[True]):.2f} | {ratio:.1f}x slower |" if ratio >= 1 else
          f"| bf16-mixed | {statistics.median(times[True]):.2f} | {1 / ratio:.1f}x faster |")
    print(f"\nprecision=auto here: {chosen} ({why})")


if __name__ == "__main__":
    main()
