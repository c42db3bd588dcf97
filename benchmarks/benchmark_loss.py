"""Peak memory of one training step at the paper's batch: 25,000 target tokens x 37,000-token vocabulary.

    python benchmarks/benchmark_loss.py                  # 25k x 37k (needs ~16 GiB free for the old loss)
    python benchmarks/benchmark_loss.py --vocab 9250     # a quarter of the vocabulary

Each variant runs in a fresh process: a small model (d_model 64, 1+1 layers; the output layer and the loss
dominate at this vocabulary) takes one step (forward, label-smoothed loss, backward, Adam) on a batch of
500 x 50 target tokens in fp32, and the growth of the process's RSS high-water mark over that step is
reported. The logits alone are tokens x vocab x 4 bytes (3.4 GiB at 25k x 37k). Variants:

- before: the loss as it was (fp32 log-softmax kept for backward, boolean indexing);
- chunked: ``label_smoothed_cross_entropy`` (fp32 sums over chunks of rows, per-row log-sum-exp kept);
- chunked, in place: the same, its gradient written over the logits (``overwrite_logits``, as the training step).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
from baselines import check_loss, unchunked_loss  # benchmarks/: the loss as it was
from recipe import recipe_adam

from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.provenance import provenance_line
from transformer_nmt.training.loss import label_smoothed_cross_entropy

VARIANTS = ("before", "chunked", "chunked, in place")


def rss_kib(field):
    """VmRSS (current) or VmHWM (high-water mark) of this process, in KiB (Linux)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def probe(variant: str, vocab: int, batch: int, length: int) -> None:
    """Run in a fresh process: one training step; print the RSS high-water growth and the step's time."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=vocab, d_model=64, n_heads=2, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=128, dropout=0.0, max_positions=length + 1))
    optimizer = recipe_adam(model.parameters())
    src = torch.randint(4, vocab, (batch, length))
    tgt = torch.randint(4, vocab, (batch, length + 1))

    def step(src, tgt):
        logits = model(src, tgt[:, :-1])  # (B, T, V)
        if variant == "before":
            loss = unchunked_loss(logits, tgt[:, 1:], 0.1, 0)[0]
        else:
            loss = label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, 0, overwrite_logits=variant != "chunked")[0]
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()

    step(src[:2, :8], tgt[:2, :9])  # warm-up: Adam's state and the kernels' thread pools, outside the measurement
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset the high-water mark to the current RSS
    base = rss_kib("VmRSS")
    start = time.perf_counter()
    step(src, tgt)
    print(json.dumps({"peak_mib": (rss_kib("VmHWM") - base) / 1024, "seconds": time.perf_counter() - start}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--batch", type=int, default=500, help="sentences of --length target tokens")
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--probe", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.probe:
        probe(args.probe, args.vocab, args.batch, args.length)
        return
    print(provenance_line({"args": vars(args)}))
    if "before" in args.variants:
        check_loss(unchunked_loss)  # the reference must compute the loss it is compared with
    tokens = args.batch * args.length
    logits_mib = tokens * args.vocab * 4 / 2 ** 20
    results = {}
    for variant in args.variants:
        # A fixed 1 MiB mmap threshold returns large freed blocks to the system at once (see benchmark_model.py).
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576")
        out = subprocess.run([sys.executable, __file__, "--probe", variant, "--vocab", str(args.vocab),
                              "--batch", str(args.batch), "--length", str(args.length)],
                             capture_output=True, text=True, env=env)
        if out.returncode:
            sys.exit(f"{variant}: exit {out.returncode}\n{out.stderr[-2000:]}")
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n### Peak memory of one training step: {tokens:,} target tokens x {args.vocab:,} vocabulary, fp32 "
          f"(d_model 64, 1+1 layers; growth of a fresh process's RSS high-water mark; torch {torch.__version__}, "
          f"1 thread)\n")
    print(f"One (tokens x V) fp32 buffer: {logits_mib:,.0f} MiB.\n")
    print("| loss | peak MiB | in (tokens x V) buffers | step seconds |")
    print("| --- | --- | --- | --- |")
    for variant, r in results.items():
        print(f"| {variant} | {r['peak_mib']:,.0f} | {r['peak_mib'] / logits_mib:.2f} | {r['seconds']:.1f} |")


if __name__ == "__main__":
    main()
