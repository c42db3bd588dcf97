"""The model of this checkout against the model of another, side by side in one process: a training step
(forward, label-smoothed loss, backward, Adam) and a cached decoding step, both models built from the same
config and seed, alternating step by step.

    git worktree add /tmp/before COMMIT
    python benchmarks/benchmark_model_versions.py --other /tmp/before/src --rounds 30
    python benchmarks/benchmark_model_versions.py --other /tmp/before/src --experiment multi30k_tiny

``--other`` is another checkout's ``src`` directory: its ``transformer_nmt/model/`` package is copied into a
temporary package ``transformer_nmt_other`` (its imports renamed), so both versions live in this process and
share its threads, allocator and load. The model is the recipe's small one (benchmarks/recipe.py; or
``--experiment``), the batch Multi30k-sized random ids (``--batch`` sentences of ``--length`` tokens), the
precision bf16 autocast where the CPU has native bf16, else fp32 (``--precision`` to choose). Each round times one
step of each version in turn, the order alternating; the table gives each version's median milliseconds and the
median of the per-round ratios (other / this: above 1, this checkout is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from recipe import recipe_adam, small_recipe, train_step  # benchmarks/

from transformer_nmt.hardware import cpu_native_bf16, reported_cpu_flags
from transformer_nmt.model.transformer import Transformer, TransformerConfig

OTHER = "transformer_nmt_other"


def other_model_package(src: Path, into: Path):
    """Another checkout's ``transformer_nmt/model`` as package OTHER (imports renamed), imported from ``into``;
    -> its ``transformer`` module."""
    package = into / OTHER
    shutil.copytree(src / "transformer_nmt" / "model", package / "model")
    (package / "__init__.py").write_text("")
    for path in (package / "model").glob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"\btransformer_nmt\.model\b", f"{OTHER}.model", text))
    sys.path.insert(0, str(into))
    return importlib.import_module(f"{OTHER}.model.transformer")


def build(transformer_module, config: dict, seed: int):
    fields = transformer_module.TransformerConfig.__dataclass_fields__
    torch.manual_seed(seed)
    return transformer_module.Transformer(transformer_module.TransformerConfig(
        **{k: v for k, v in config.items() if k in fields}))


@torch.no_grad()
def decode_steps(model, src, steps: int, autocast) -> None:
    with autocast():
        memory = model.encode(src)
        cache = model.new_cache()
        token = torch.full((src.shape[0], 1), 2)
        for _ in range(steps):
            token = model.decode(token, memory, src, cache=cache)[:, -1:].argmax(-1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", type=Path, required=True, help="another checkout's src directory")
    parser.add_argument("--experiment", default=None, help="the model of experiment=NAME (default: model=small)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=48, help="sentences per batch")
    parser.add_argument("--length", type=int, default=16, help="tokens per sentence (Multi30k's mean is ~15)")
    parser.add_argument("--decode-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and cpu_native_bf16()[0])
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    config = {**small_recipe(args.experiment)[0], "dropout": 0.0}  # dropout's masks draw from the RNG: off

    with tempfile.TemporaryDirectory() as tmp:
        other = other_model_package(args.other, Path(tmp))
        models = {"this": build(sys.modules[Transformer.__module__], config, 0), "other": build(other, config, 0)}
        for model in models.values():
            model.train()
        this_state, other_state = models["this"].state_dict(), models["other"].state_dict()
        same_init = [torch.equal(a, b) for a, b in zip(this_state.values(), other_state.values())]
        optimizers = {name: recipe_adam(model.parameters()) for name, model in models.items()}
        generator = torch.Generator().manual_seed(1)
        src = torch.randint(4, config["vocab_size"], (args.batch, args.length), generator=generator)
        tgt = torch.randint(4, config["vocab_size"], (args.batch, args.length + 1), generator=generator)
        times = {(task, name): [] for task in ("train", "decode") for name in models}
        for name in models:  # warm-up
            train_step(models[name], optimizers[name], src, tgt, autocast)
            decode_steps(models[name].eval(), src, 2, autocast)
            models[name].train()
        for round_ in range(args.rounds):
            order = list(models) if round_ % 2 == 0 else list(reversed(models))
            for name in order:
                start = time.perf_counter()
                train_step(models[name], optimizers[name], src, tgt, autocast)
                times["train", name].append(time.perf_counter() - start)
            for name in order:
                models[name].eval()
                start = time.perf_counter()
                decode_steps(models[name], src, args.decode_steps, autocast)
                times["decode", name].append(time.perf_counter() - start)
                models[name].train()

    lscpu_flags = " ".join(reported_cpu_flags())
    print(f"\n### This checkout's model against {args.other} (same config, same seed), {args.rounds} alternating "
          f"rounds, {'bf16 autocast' if bf16 else 'fp32'}, {args.threads} thread(s), torch {torch.__version__}; "
          f"CPU flags: {lscpu_flags}\n")
    print(f"model: {TransformerConfig(**{k: v for k, v in config.items()}).to_dict()}")
    print(f"identical initial weights: {all(same_init) and len(this_state) == len(other_state)} "
          f"({sum(same_init)} of {len(this_state)} tensors)\n")
    print("| step | this, ms (median) | other, ms (median) | other / this (median of per-round ratios) |")
    print("| --- | --- | --- | --- |")
    for task, what in (("train", f"training step, {args.batch} x {args.length} tokens"),
                       ("decode", f"{args.decode_steps} cached greedy decoding steps, batch {args.batch}")):
        ratios = [o / t for t, o in zip(times[task, "this"], times[task, "other"])]
        print(f"| {what} | {1000 * statistics.median(times[task, 'this']):.1f} | "
              f"{1000 * statistics.median(times[task, 'other']):.1f} | {statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
