"""Benchmark the model against torch.nn.Transformer, the attention kernels against each other, cached decoding.

    python benchmarks/benchmark_model.py                          # every table (several minutes on 2 CPU cores)
    python benchmarks/benchmark_model.py --quick                  # fewer steps, smaller memory probe
    python benchmarks/benchmark_model.py --tables kernels decode_kernels   # only the kernel tables

Prints markdown tables (``--tables`` picks them):
- ``throughput``: training throughput (target tokens/s for forward + backward + Adam step) of our model
  with the plain and the fused kernel and with ``auto`` (what attention.auto_kernel picks for the
  precision), and of torch.nn.Transformer with the same dimensions, embeddings, output layer and
  dropout, in fp32 and in bf16 autocast, batch 128 x 20; where the CPU has no native bf16 the bf16 rows
  measure emulation (the table's heading says which);
- ``kernels``: the same training step in fp32 at target lengths 32, 128 and 512 (1,024 target tokens
  per batch), ours with the fused kernel (SDPA, is_causal and key-padding masks: Flash-eligible on a
  GPU), ours with the plain kernel, and nn.Transformer;
- ``memory``: peak memory (growth of a fresh process's RSS high-water mark, forward + backward) of plain
  and blocked attention at Lq = Lk = 4096;
- ``decode``: decoder step time at target length 100, with the attention cache and recomputing the prefix;
- ``decode_kernels``: one cached decoder step (one query against t cached keys) with the fused and the
  plain kernel, at t = 8, 32 and 128.
Timed variants alternate, one step of each, and every ratio is the median of per-pair ratios. The kernel
tables are what ``model.attention=auto`` follows on CPU (attention.choose_kernel).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from recipe import recipe_adam, small_recipe  # benchmarks/
from torch import nn

from transformer_nmt.hardware import cpu_native_bf16, reported_cpu_flags
from transformer_nmt.model.attention import auto_kernel, blocked_attention, scaled_dot_product_attention
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.provenance import provenance_line

# the recipe's small model (each table sets the kernel), positions up to the recipe's data.max_positions
DIMS = {**{k: v for k, v in small_recipe()[0].items() if k != "attention"}, "max_positions": 256}
PAD = 0
TABLES = ("throughput", "kernels", "memory", "decode", "decode_kernels")


class TorchTransformerMT(nn.Module):
    """The peer: nn.Transformer between the same tied embedding, positions and output layer as ours."""

    def __init__(self, ours: Transformer):
        super().__init__()
        cfg = ours.config
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD)
        self.register_buffer("positions", ours.positions.table.clone())
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers,
                                          cfg.d_ff, cfg.dropout, batch_first=True)
        self.scale = math.sqrt(cfg.d_model)

    def forward(self, src, tgt_in):
        T = tgt_in.shape[1]
        src_x = self.dropout(self.embed(src) * self.scale + self.positions[: src.shape[1]])
        tgt_x = self.dropout(self.embed(tgt_in) * self.scale + self.positions[:T])
        causal = torch.ones(T, T, dtype=torch.bool, device=src.device).triu(1)
        hidden = self.transformer(src_x, tgt_x, tgt_mask=causal, src_key_padding_mask=src == PAD,
                                  tgt_key_padding_mask=tgt_in == PAD, memory_key_padding_mask=src == PAD,
                                  tgt_is_causal=True)
        return F.linear(hidden, self.embed.weight)


def random_batch(batch, length, vocab, generator, shortest=16):
    src = torch.randint(4, vocab, (batch, length), generator=generator)
    tgt = torch.randint(4, vocab, (batch, length + 1), generator=generator)
    for row in range(batch):  # ragged lengths, as in a real bucket: shortest..length tokens
        cut = int(torch.randint(shortest, length + 1, (1,), generator=generator))
        src[row, cut:] = PAD
        tgt[row, cut + 1:] = PAD
    return src, tgt


def train_step(model, optimizer, src, tgt, precision):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD,
                               label_smoothing=0.1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def throughput_table(steps, batch, length):
    rows = []
    generator = torch.Generator().manual_seed(0)
    batches = [random_batch(batch, length, DIMS["vocab_size"], generator) for _ in range(4)]
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        models = {f"ours ({kernel})": Transformer(TransformerConfig(**DIMS, attention=kernel))
                  for kernel in ("plain", "fused")}
        auto = auto_kernel("cpu", torch.bfloat16 if precision == "bf16" else torch.float32)[0]
        models[f"ours (auto = {auto})"] = Transformer(TransformerConfig(**DIMS, attention="auto"))
        models["nn.Transformer"] = TorchTransformerMT(models["ours (plain)"])
        optimizers = {name: recipe_adam(m.parameters()) for name, m in models.items()}
        for model in models.values():
            model.train()
        times = {name: [] for name in models}
        for step in range(steps + 2):  # two warm-up steps each
            src, tgt = batches[step % len(batches)]
            for name, model in models.items():  # alternate: one step of each
                elapsed = timed(lambda: train_step(model, optimizers[name], src, tgt, precision))
                if step >= 2:
                    times[name].append(elapsed)
        tokens = [int((tgt[:, 1:] != PAD).sum()) for _, tgt in batches]
        mean_tokens = statistics.mean(tokens[(s + 2) % len(batches)] for s in range(steps))
        peer = times["nn.Transformer"]
        for name, ts in times.items():
            ratio = statistics.median(p / t for p, t in zip(peer, ts))
            rows.append((precision, name, mean_tokens / statistics.median(ts), ratio))
    print(f"\n### Training throughput (batch {batch} x {length} tokens, d_model 256, 4 heads, 3+3 layers, "
          f"d_ff 1024, vocab 8000; {steps} alternating steps, {torch.get_num_threads()} thread(s))\n")
    print("| precision | model | target tokens/s | speed vs nn.Transformer (median of per-step ratios) |")
    print("| --- | --- | --- | --- |")
    for precision, name, tps, ratio in rows:
        print(f"| {precision} | {name} | {tps:,.0f} | {ratio:.2f}x |")


def alternate(variants, steps, warmup=1):
    """Run one step of each variant in turn, ``warmup + steps`` rounds; the timed rounds' seconds per variant."""
    times = {name: [] for name in variants}
    for step in range(warmup + steps):
        for name, run in variants.items():
            elapsed = timed(lambda: run(step))
            if step >= warmup:
                times[name].append(elapsed)
    return times


def ratio(times, slower, faster):
    """Median over rounds of time[slower] / time[faster]: how many times faster ``faster`` is."""
    return statistics.median(s / f for s, f in zip(times[slower], times[faster]))


def kernel_table(steps, tokens, lengths):
    """fp32 training step at several target lengths: ours fused, ours plain, nn.Transformer."""
    rows = []
    for length in lengths:
        batch = max(1, tokens // length)
        generator = torch.Generator().manual_seed(length)
        batches = [random_batch(batch, length, DIMS["vocab_size"], generator, shortest=3 * length // 4)
                   for _ in range(2)]
        dims = {**DIMS, "max_positions": max(DIMS["max_positions"], length + 1)}
        torch.manual_seed(0)
        models = {kernel: Transformer(TransformerConfig(**dims, attention=kernel)) for kernel in ("fused", "plain")}
        models["nn.Transformer"] = TorchTransformerMT(models["plain"])
        optimizers = {name: recipe_adam(m.parameters()) for name, m in models.items()}
        variants = {name: (lambda step, name=name: train_step(models[name].train(), optimizers[name],
                                                              *batches[step % 2], "fp32"))
                    for name in models}
        times = alternate(variants, steps)
        tgt_tokens = statistics.mean(int((tgt[:, 1:] != PAD).sum()) for _, tgt in batches)
        rows.append((length, batch, {name: tgt_tokens / statistics.median(ts) for name, ts in times.items()},
                     ratio(times, "plain", "fused"), ratio(times, "nn.Transformer", "fused"),
                     ratio(times, "nn.Transformer", "plain")))
    print(f"\n### Attention kernels in a training step, fp32 ({tokens:,} target tokens per batch, lengths 3/4..1 of "
          f"the target length; d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocab 8000; {steps} alternating "
          f"steps, {torch.get_num_threads()} thread(s))\n")
    print("| target length | batch | target tokens/s: fused / plain / nn.Transformer | fused vs plain "
          "| fused vs nn.Transformer | plain vs nn.Transformer |")
    print("| --- | --- | --- | --- | --- | --- |")
    for length, batch, tps, fused_plain, fused_peer, plain_peer in rows:
        print(f"| {length} | {batch} | {tps['fused']:,.0f} / {tps['plain']:,.0f} / {tps['nn.Transformer']:,.0f} "
              f"| {fused_plain:.2f}x | {fused_peer:.2f}x | {plain_peer:.2f}x |")


@torch.no_grad()
def decode_kernel_table(repeats, lengths, batch):
    """One cached decoder step (one query, t cached keys) with the fused and with the plain kernel."""
    torch.manual_seed(0)
    models = {kernel: Transformer(TransformerConfig(**DIMS, attention=kernel)).eval() for kernel in ("fused", "plain")}
    models["plain"].load_state_dict(models["fused"].state_dict())
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, DIMS["vocab_size"], (batch, 30), generator=generator)
    rows = []
    for length in lengths:
        tgt = torch.randint(4, DIMS["vocab_size"], (batch, length), generator=generator)
        state = {}
        for kernel, model in models.items():
            memory = model.encode(src)
            cache = model.new_cache()
            model.decode(tgt[:, : length - 1], memory, src, cache=cache)  # prefill positions 0..length-2
            state[kernel] = (model, memory, cache)

        def step(kernel):
            model, memory, cache = state[kernel]
            model.decode(tgt[:, length - 1:], memory, src, cache=cache)
            for layer in cache.layers:  # drop the step again, so every repeat measures position length-1
                layer.self_attn.k, layer.self_attn.v = layer.self_attn.k[:, :, :-1], layer.self_attn.v[:, :, :-1]

        times = alternate({kernel: (lambda _, kernel=kernel: step(kernel)) for kernel in models}, repeats, warmup=2)
        rows.append((length, 1000 * statistics.median(times["fused"]), 1000 * statistics.median(times["plain"]),
                     ratio(times, "plain", "fused")))
    print(f"\n### Attention kernels in one cached decoder step, fp32 (batch {batch}, source 30 tokens, "
          f"{repeats} alternating repeats, {torch.get_num_threads()} thread(s))\n")
    print("| cached target length | fused ms | plain ms | fused vs plain |")
    print("| --- | --- | --- | --- |")
    for length, fused_ms, plain_ms, fused_plain in rows:
        print(f"| {length} | {fused_ms:.2f} | {plain_ms:.2f} | {fused_plain:.2f}x |")


def rss_kib(field):
    """VmRSS (current) or VmHWM (high-water mark) of this process, in KiB (Linux)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def memory_probe(kernel, length, heads, d_k):
    """Run in a fresh process: growth of the RSS high-water mark over forward + backward of one call."""
    torch.manual_seed(0)

    def attention_forward_backward(length):
        q, k, v = (torch.randn(1, heads, length, d_k, requires_grad=True) for _ in range(3))
        mask = torch.ones(1, 1, 1, length, dtype=torch.bool)
        if kernel == "plain":
            out, _ = scaled_dot_product_attention(q, k, v, mask)
        else:
            out = blocked_attention(q, k, v, mask, block_size=128)
        out.sum().backward()

    attention_forward_backward(256)  # warm-up: loads kernels and thread pools outside the measurement
    q, k, v = (torch.randn(1, heads, length, d_k, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 1, 1, length, dtype=torch.bool)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset the high-water mark to the current RSS
    base = rss_kib("VmRSS")
    if kernel == "plain":
        out, _ = scaled_dot_product_attention(q, k, v, mask)
    else:
        out = blocked_attention(q, k, v, mask, block_size=128)
    out.sum().backward()
    print(json.dumps({"kernel": kernel, "peak_mib": (rss_kib("VmHWM") - base) / 1024}))


def memory_table(length, heads, d_k):
    results = {}
    for kernel in ("plain", "blocked"):
        # glibc keeps freed blocks below its (adaptive) mmap threshold in the heap, so the RSS peak would
        # count allocator retention; a fixed 1 MiB threshold returns large freed blocks at once.
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576")
        out = subprocess.run([sys.executable, __file__, "--memory-probe", kernel, "--length", str(length),
                              "--heads", str(heads)], capture_output=True, text=True, check=True, env=env)
        results[kernel] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
    print(f"\n### Attention peak memory, forward + backward (B 1, {heads} heads, d_k {d_k}, "
          f"Lq = Lk = {length}, fp32; growth of the process's RSS high-water mark)\n")
    print("| kernel | peak MiB | vs plain |")
    print("| --- | --- | --- |")
    for kernel, mib in results.items():
        print(f"| {kernel} | {mib:,.0f} | {results['plain'] / mib:.1f}x lower |" if kernel != "plain"
              else f"| {kernel} | {mib:,.0f} | 1.0x |")


@torch.no_grad()
def decode_table(repeats, length, batch):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**DIMS)).eval()
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, DIMS["vocab_size"], (batch, 30), generator=generator)
    tgt = torch.randint(4, DIMS["vocab_size"], (batch, length), generator=generator)
    memory = model.encode(src)
    cache = model.new_cache()
    model.decode(tgt[:, : length - 1], memory, src, cache=cache)  # prefill positions 0..length-2

    def cached_step():
        model.decode(tgt[:, length - 1:], memory, src, cache=cache)
        for layer in cache.layers:  # drop the step again, so every repeat measures position length-1
            layer.self_attn.k, layer.self_attn.v = layer.self_attn.k[:, :, :-1], layer.self_attn.v[:, :, :-1]

    def full_step():
        model.decode(tgt, memory, src)

    cached, full = [], []
    for _ in range(repeats):
        cached.append(timed(cached_step))
        full.append(timed(full_step))
    ratio = statistics.median(f / c for f, c in zip(full, cached))
    print(f"\n### Decoder step at target length {length} (batch {batch}, same model dims; "
          f"{repeats} alternating repeats)\n")
    print("| decoder step | ms per step | speed-up |")
    print("| --- | --- | --- |")
    print(f"| recompute the prefix | {1000 * statistics.median(full):.1f} | 1.0x |")
    print(f"| with the attention cache | {1000 * statistics.median(cached):.1f} | {ratio:.1f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and a smaller memory probe")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 steadies the ratios)")
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="tables to print")
    parser.add_argument("--memory-probe", choices=["plain", "blocked"], help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=4096, help=argparse.SUPPRESS)
    parser.add_argument("--heads", type=int, default=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_probe:
        memory_probe(args.memory_probe, args.length, args.heads, 64)
        return
    print(provenance_line({"args": vars(args)}))
    native, evidence = cpu_native_bf16()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); CPU flags: "
          f"{' '.join(reported_cpu_flags())}; bf16 "
          f"{'native (' + evidence + ')' if native else 'emulated: the bf16 rows measure emulation'}")
    tables = {
        "throughput": lambda: throughput_table(steps=3 if args.quick else 10, batch=128, length=20),
        "kernels": lambda: kernel_table(steps=2 if args.quick else 5, tokens=1024, lengths=(32, 128, 512)),
        "memory": lambda: memory_table(length=1024 if args.quick else 4096, heads=8, d_k=64),
        "decode": lambda: decode_table(repeats=5 if args.quick else 20, length=100, batch=32),
        "decode_kernels": lambda: decode_kernel_table(repeats=5 if args.quick else 20, lengths=(8, 32, 128),
                                                      batch=32),
    }
    for name in args.tables:
        tables[name]()


if __name__ == "__main__":
    main()
