"""The CPU recipe's training step: target tokens/s and share of the matmul ceiling, by precision, batch size,
attention kernel and torch.compile, side by side in one process.

    python benchmarks/benchmark_step.py                       # the default table (about 3 minutes on 2 loaded cores)
    python benchmarks/benchmark_step.py --tokens 1024 2048 --rounds 5 --no-compile
    python benchmarks/benchmark_step.py --threads 2           # the recipe's thread count (a quiet machine only)
    python benchmarks/benchmark_step.py --tokens 2048 --no-compile --kernels plain fused --previous-loss
    python benchmarks/benchmark_step.py --tokens 1024 --no-compile --kernels fused --precisions 32-true --ema
    python benchmarks/benchmark_step.py --tokens 4096 --no-compile --kernels plain --precisions bf16-mixed --rdrop \
        --reference "bf16-mixed plain" --threads 2
    python benchmarks/benchmark_step.py --tokens 1024 4096 --no-compile --kernels plain --precisions bf16-mixed \
        --previous-dropout --previous-chunks --reference "bf16-mixed plain" --threads 2 --rounds 9

The recipe's small model and training settings (conf/train.yaml with model=small, composed as the app composes
them: d_model 256, 4 heads, 3+3 layers, d_ff 1024, dropout 0.1; data.vocab_size 8000; Adam's betas and eps, label
smoothing) take the training step of training.TranslationModule, its own methods in Lightning's order:
on_train_batch_start (the dropout seed), training_step (forward, the label-smoothed loss) under bf16 autocast for
bf16-mixed (as Lightning's bf16-mixed wraps it), backward, on_before_optimizer_step (the gradients rescaled per
target token, clip_grad_norm_), then the optimizer and learning-rate schedule of configure_optimizers; a stand-in
for the Trainer answers what those methods ask of it (one process, no accumulation, no logging step).
Batches: Multi30k's own sentence lengths (the first 20,000 pairs of data/multi30k/train in words, times 1.2
subwords per word for the 8k BPE vocabulary, + eos), bucketed by the project's TokenBucketBatchSampler at each
``--tokens`` budget; random ids (a matmul's speed does not depend on them).

Variants (every one at every batch size): each precision with each attention kernel eagerly, and with
``--compile`` the model's forward under torch.compile (as train.compile=true does) with each precision's
``auto`` kernel, at one batch size (``--compile-tokens``; compiling takes minutes here). Each of these adds
every precision's ``auto`` kernel with one part as it was (benchmarks/baselines.py, checked against the current
code before timing): ``--previous-loss`` the loss before its fused log_softmax/softmax kernels (in the chunks of
then, 2^25 logits), called by training_step in place of today's; ``--previous-chunks`` today's loss in chunks
of 2^25 logits (128 MiB in fp32), as it ran on CPU before training.loss.LOSS_CHUNK_ELEMENTS_CPU;
``--previous-dropout`` torch's ``nn.Dropout`` in place of dropout.py's. ``--ema`` and ``--rdrop`` add a training
option instead: train.ema_decay's moving average of the weights, updated after every step as
module.optimizer_step updates it; train.rdrop_alpha's two passes of every batch and their divergence (what a run
with the option costs per update, e.g. to give it the updates another host's hour holds). Every round runs one
step of every variant in turn, on the same batch per batch size (compiled variants first warm up on every batch of the
pool, their compile time reported apart); tokens/s is the median over rounds, and every "vs" column the
median of the per-round ratios to the same round's step of the ``--reference`` variant (default: fp32 eager
with the fused kernel) at the same batch size (alternation cancels the machine's load, which drifts). The
ceiling is flops.matmul_ceiling at the batches' mean target rows, per precision, measured in this process
every round between the steps it rates, and the share the median of per-round
shares; model FLOPs are flops.FlopCount's (scripts/gpu_check.py and results.json use the same definition).
``--json PATH`` also writes the report (rows, ceilings, the batches' shapes) as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from baselines import (  # benchmarks/: the parts as they were
    check_loss,
    previous_loss,
    with_32bit_dropout,
    with_torch_dropout,
)
from recipe import small_recipe

import transformer_nmt.training.module as module_code
from transformer_nmt.data.batching import TokenBucketBatchSampler, pad_pairs, pair_widths
from transformer_nmt.hardware import reported_cpu_flags
from transformer_nmt.model.attention import MultiHeadAttention, auto_kernel
from transformer_nmt.model.flops import FlopCount, matmul_ceiling
from transformer_nmt.provenance import provenance_line
from transformer_nmt.training.loss import LOSS_CHUNK_ELEMENTS, label_smoothed_cross_entropy
from transformer_nmt.training.module import TranslationModule
from transformer_nmt.training.precision import compute_dtype

REPO = Path(__file__).resolve().parents[1]


SMALL, TRAIN = small_recipe()
SUBWORDS_PER_WORD = 1.2
PRECISIONS = ("32-true", "bf16-mixed")


def multi30k_lengths(n: int = 20000) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths in subwords, estimated from the first ``n`` en-de pairs' word counts."""
    lengths = []
    for lang in ("en", "de"):
        with gzip.open(REPO / "data" / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            words = [len(line.split()) for _, line in zip(range(n), f)]
        lengths.append(np.maximum(np.round(np.array(words) * SUBWORDS_PER_WORD), 1).astype(np.int64))
    return lengths[0], lengths[1]


def batches(max_tokens: int, count: int, seed: int = 0, multiple: int = 8) -> list[dict]:
    """``count`` training batches of at most ``max_tokens`` padded tokens per side, as the recipe's sampler cuts
    them, widths a multiple of ``multiple`` (as train.compile=true pads them; the same for every variant)."""
    src_lens, tgt_lens = multi30k_lengths()
    rng = np.random.default_rng(seed)
    sampler = TokenBucketBatchSampler(pair_widths(src_lens, tgt_lens), max_tokens, seed=seed,
                                      pad_to_multiple=multiple)
    out = []
    for indices in sampler:
        ragged = []
        for lens in (src_lens[indices], tgt_lens[indices]):
            ragged.append((rng.integers(4, SMALL["vocab_size"], int(lens.sum())), np.r_[0, np.cumsum(lens)]))
        out.append(pad_pairs(ragged[0], ragged[1], indices, multiple))
        if len(out) == count:
            break
    return out


# loss variant -> (what a variant's name adds, the loss function)
LOSSES = {"fused": ("", label_smoothed_cross_entropy), "previous": (" previous loss", previous_loss),
          "large chunks": (" loss in large chunks", partial(label_smoothed_cross_entropy,
                                                           chunk_elements=LOSS_CHUNK_ELEMENTS))}


# dropout variant -> (what a variant's name adds, the swap that makes it; None: dropout.py's as it is)
DROPOUTS = {"ours": ("", None), "torch": (" torch dropout", with_torch_dropout),
            "32-bit": (" 32-bit dropout", with_32bit_dropout)}


# training option -> (what a variant's name adds, the train.* settings that switch it on); their values do not
# change a step's cost
OPTIONS = {None: ("", {}), "ema": (" ema", {"ema_decay": 0.999}), "rdrop": (" rdrop", {"rdrop_alpha": 5.0})}


def variant_name(precision: str, kernel: str, compiled: bool, loss: str = "fused", dropout: str = "ours",
                 option: str | None = None) -> str:
    suffix = (" compiled" if compiled else "") + LOSSES[loss][0] + DROPOUTS[dropout][0] + OPTIONS[option][0]
    return f"{precision} {kernel}{suffix}"


class StandInTrainer:
    """What TranslationModule's step methods read of their Trainer, for one process stepping by hand: no gradient
    accumulation, one rank, never a logging step (logging is Lightning's, not the step's, cost)."""

    accumulate_grad_batches = world_size = 1
    global_rank = global_step = 0
    log_every_n_steps, should_stop = 0, False  # training.lightning_adapter.is_logging_step: never
    precision_plugin = None  # no scaler: the non-finite check (module.py) counts the gradient norm too


class Step:
    """One variant: a TranslationModule (its own copy of the shared initial weights), the optimizer and schedule
    of its configure_optimizers, its precision."""

    def __init__(self, base: TranslationModule, precision: str, kernel: str, compiled: bool, loss: str = "fused",
                 dropout: str = "ours", option: str | None = None):
        self.precision, self.kernel, self.compiled = precision, kernel, compiled
        self.loss = LOSSES[loss][1]
        # base's model and train settings with the variant's training option (none: base's own), base's weights
        train = {**base.optim, **OPTIONS[option][1]}
        self.module = TranslationModule(base.hparams.model_config, train).train()
        self.module.load_state_dict(base.state_dict())
        self.module.trainer = StandInTrainer()
        for layer in self.module.modules():
            if isinstance(layer, MultiHeadAttention):
                layer.kernel = kernel
        swap = DROPOUTS[dropout][1]
        if swap is not None:  # a previous version: torch's nn.Dropout (a bernoulli_ mask), or our 32-bit mask
            swap(self.module.model)
        if compiled:
            self.module.model.compile()
        optimization = self.module.configure_optimizers()
        self.optimizer, self.scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
        self.module.on_fit_start()  # train.ema_decay: the average starts here (else nothing happens)
        self.name = variant_name(precision, kernel, compiled, loss, dropout, option)

    def __call__(self, batch: dict) -> float:
        """One training step on ``batch`` through the module's own methods; returns its seconds."""
        module = self.module
        start = time.perf_counter()
        module.on_train_batch_start(batch, 0)
        # training_step calls the module's label_smoothed_cross_entropy: a loss variant stands in for it
        swap = mock.patch.object(module_code, "label_smoothed_cross_entropy", self.loss) \
            if self.loss is not label_smoothed_cross_entropy else contextlib.nullcontext()
        with swap, torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed"):
            loss = module.training_step(batch, 0)
        loss.backward()
        module.on_before_optimizer_step(self.optimizer)
        self.optimizer.step()
        if module.ema is not None:  # what module.optimizer_step adds to the optimizer's step
            module.ema.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096], help="data.max_tokens values")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--kernels", nargs="+", default=["plain", "fused"], choices=["plain", "fused", "blocked"])
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="also each precision's auto kernel under torch.compile (at --compile-tokens only)")
    parser.add_argument("--compile-tokens", type=int, default=None,
                        help="the batch size of the compiled variants (default: the smallest --tokens)")
    parser.add_argument("--previous-loss", action="store_true",
                        help="also each precision's auto kernel with the loss's previous implementation")
    parser.add_argument("--previous-chunks", action="store_true",
                        help="also each precision's auto kernel with the loss in 128 MiB chunks (before 4 MiB on CPU)")
    parser.add_argument("--previous-dropout", action="store_true",
                        help="also each precision's auto kernel with torch's dropout (before dropout.py) and with "
                             "dropout.py's 32-bit mask (before 16-bit integers)")
    parser.add_argument("--ema", action="store_true",
                        help="also each precision's auto kernel with train.ema_decay's moving average updated after "
                             "every step")
    parser.add_argument("--rdrop", action="store_true",
                        help="also each precision's auto kernel with train.rdrop_alpha's two passes and their "
                             "divergence")
    parser.add_argument("--experiment", default=None,
                        help="the model, vocabulary and train settings of experiment=NAME (e.g. multi30k_tiny; "
                             "default: model=small, the recipe's shape)")
    parser.add_argument("--dropout", type=float, default=None,
                        help="the model's dropout (default: the model's; the recipe: 0.1 in fp32, 0.3 in bf16)")
    parser.add_argument("--reference", default=None,
                        help='the variant the "vs" column divides by, e.g. "bf16-mixed plain" (default: '
                             '"32-true fused", else the first variant)')
    parser.add_argument("--rounds", type=int, default=3, help="timed steps of every variant (after a warm-up)")
    parser.add_argument("--pool", type=int, default=2, help="distinct batches per batch size, used in turn")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the report here as JSON")
    args = parser.parse_args(argv)
    global SMALL, TRAIN  # the shape every part of this run reads
    SMALL, TRAIN = small_recipe(args.experiment)
    if args.dropout is None:
        args.dropout = SMALL["dropout"]
    torch.set_num_threads(args.threads)
    provenance = provenance_line({"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}})
    print(provenance)
    torch.manual_seed(0)
    started = time.perf_counter()
    if args.previous_loss:
        check_loss(previous_loss)  # before anything is timed
    # (precision, kernel, compiled, part as it was) of every variant, checked before anything is built
    specs = [(p, k, False, {}) for p in args.precisions for k in args.kernels]
    for wanted, compiled, part in ((args.compile, True, {}), (args.previous_loss, False, {"loss": "previous"}),
                                   (args.previous_chunks, False, {"loss": "large chunks"}),
                                   (args.previous_dropout, False, {"dropout": "torch"}),
                                   (args.previous_dropout, False, {"dropout": "32-bit"}),
                                   (args.ema, False, {"option": "ema"}), (args.rdrop, False, {"option": "rdrop"})):
        if wanted:  # each precision's auto kernel, compiled or with one part as it was
            specs += [(p, auto_kernel("cpu", compute_dtype(p))[0], compiled, part) for p in args.precisions]
    eager = [variant_name(p, k, c, **part) for p, k, c, part in specs if not c]  # a reference runs at every size
    if args.reference is not None and args.reference not in eager:
        raise SystemExit(f"--reference {args.reference!r} is not an eager variant of this run: {eager}")
    reference = args.reference or ("32-true fused" if "32-true fused" in eager else eager[0])
    base = TranslationModule({**SMALL, "dropout": args.dropout}, TRAIN)
    count = FlopCount.of(base.model)
    pools = {n: batches(n, args.pool, seed=n) for n in args.tokens}
    variants = [Step(base, p, k, c, **part) for p, k, c, part in specs]

    compile_tokens = args.compile_tokens or min(args.tokens)

    def sizes(v: Step) -> list[int]:  # the batch sizes a variant runs at
        return [compile_tokens] if v.compiled else list(pools)

    def ceiling(p: str, n: int) -> dict:
        rows = round(statistics.mean(b["tgt"][:, 1:].numel() for b in pools[n]))
        return matmul_ceiling(SMALL["d_model"], SMALL["d_ff"], SMALL["vocab_size"], rows, compute_dtype(p),
                              seconds=0.2)

    warm_up = {}
    for v in variants:  # warm-up: one step on every batch (compiled variants compile here, per shape)
        start = time.perf_counter()
        for n in sizes(v):
            for batch in pools[n]:
                v(batch)
        warm_up[v.name] = time.perf_counter() - start
    times = {(v.name, n): [] for v in variants for n in sizes(v)}
    ceilings = {(p, n): [] for p in args.precisions for n in pools}
    for r in range(args.rounds):  # the ceiling too is measured every round, between the steps it rates
        for n, pool in pools.items():
            batch = pool[r % len(pool)]
            for v in variants:
                if n in sizes(v):
                    times[v.name, n].append((v(batch), batch))
            for p in args.precisions:
                ceilings[p, n].append(ceiling(p, n)["ceiling_gflops"])

    rows = []
    for n in pools:
        ref = [s for s, _ in times[reference, n]]
        for v in variants:
            if n not in sizes(v):
                continue
            steps = times[v.name, n]
            tokens = [int((b["tgt"][:, 1:] != 0).sum()) for _, b in steps]
            rates = [t / s for (s, _), t in zip(steps, tokens)]
            gflops = [float(count(b["src"], b["tgt"])) / s / 1e9 for s, b in steps]
            rows.append({"tokens": n, "variant": v.name, "precision": v.precision, "kernel": v.kernel,
                         "compiled": v.compiled, "tgt_tokens_per_sec": statistics.median(rates),
                         "ms_per_step": 1000 * statistics.median(s for s, _ in steps),
                         "model_gflops": statistics.median(gflops),
                         "ceiling_gflops": statistics.median(ceilings[v.precision, n]),
                         "share": statistics.median(g / c for g, c in zip(gflops, ceilings[v.precision, n])),
                         "vs_reference": statistics.median(r / s for r, (s, _) in zip(ref, steps)),
                         "warm_up_seconds": warm_up[v.name]})
    report = {"rows": rows, "ceilings": {f"{p} {n}": c for (p, n), c in ceilings.items()}, "reference": reference,
              "seconds": time.perf_counter() - started, "threads": args.threads, "rounds": args.rounds,
              "shape": (f"{args.experiment or 'model=small'} (d_model {SMALL['d_model']}, {SMALL['n_encoder_layers']}+"
                        f"{SMALL['n_decoder_layers']} layers, d_ff {SMALL['d_ff']}, {SMALL['vocab_size']:,} "
                        f"vocabulary, dropout {args.dropout})"),
              "cpu_flags": reported_cpu_flags(), "load": os.getloadavg(),
              "provenance": json.loads(provenance.partition(": ")[2])}
    print_report(report, pools)
    if args.json:
        shapes = {n: [{"src": list(b["src"].shape), "tgt": list(b["tgt"].shape),
                        "tgt_tokens": int((b["tgt"][:, 1:] != 0).sum())} for b in pool] for n, pool in pools.items()}
        args.json.write_text(json.dumps({**report, "batches": shapes}, indent=1) + "\n")
    return report


def print_report(report: dict, pools: dict) -> None:
    rows = report["rows"]
    print(f"\n### Training step of {report['shape']}, Multi30k-length batches, {report['threads']} "
          f"thread(s), torch {torch.__version__}; CPU flags: {' '.join(report['cpu_flags']) or 'none'}; "
          f"load average {' '.join(f'{x:.2f}' for x in report['load'])}; median of {report['rounds']} rounds\n")
    print("| max_tokens | target tokens/batch | variant | target tokens/s | ms/step | model GFLOP/s | "
          f"ceiling GFLOP/s | share of ceiling | vs {report['reference']} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        pool = pools[row["tokens"]]
        per_batch = statistics.mean(int((b["tgt"][:, 1:] != 0).sum()) for b in pool)
        print(f"| {row['tokens']} | {per_batch:,.0f} | {row['variant']} | {row['tgt_tokens_per_sec']:,.0f} | "
              f"{row['ms_per_step']:,.0f} | {row['model_gflops']:.1f} | {row['ceiling_gflops']:,.0f} | "
              f"{100 * row['share']:.1f}% | {row['vs_reference']:.2f}x |")
    compiled = [r for r in rows if r["compiled"]]
    if compiled:
        print("\nWarm-up seconds (one step on every batch of its sizes; for the compiled rows torch.compile's "
              "compilation, minutes when cold, seconds when inductor's on-disk cache holds an earlier run's "
              "kernels): " + ", ".join(f"{name} {s:.0f}" for name, s in
                                             {r["variant"]: r["warm_up_seconds"] for r in rows}.items()))
    print("\nFastest per precision (target tokens/s):")
    for precision in dict.fromkeys(r["precision"] for r in rows):
        best = max((r for r in rows if r["precision"] == precision), key=lambda r: r["tgt_tokens_per_sec"])
        print(f"- {precision}: max_tokens {best['tokens']}, {best['variant']}: {best['tgt_tokens_per_sec']:,.0f} "
              f"target tokens/s, {100 * best['share']:.1f}% of the {best['ceiling_gflops']:,.0f} GFLOP/s ceiling")
    print(f"\n{report['seconds']:.0f} s in all")


if __name__ == "__main__":
    sys.exit(main() and 0)
