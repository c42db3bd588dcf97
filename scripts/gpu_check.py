"""The GPU check: CUDA tests, throughput, MFU and peak memory of the base model, and a falling loss.

    python scripts/gpu_check.py OUT_DIR            # on a CUDA GPU (scripts/gpu_check.sh installs, then runs this)
    GPU_CHECK_ALLOW_CPU=1 python scripts/gpu_check.py OUT_DIR   # dry run on a CPU, tiny sizes

1. ``pytest -m cuda``: the training step under ``torch.cuda.set_sync_debug_mode("error")`` (bf16 and fp16),
   every attention kernel against plain in bf16 and fp16, the chunked loss against float64.
2. The ceiling: an 8192^3 bf16 matmul, timed with CUDA events (median of 10 after 3 warm-ups).
3. For each attention kernel (and the fused one compiled): the base model (d_model 512, N 6, h 8, d_ff 2048,
   37k vocabulary) trains through the project's own LightningModule and a Lightning Trainer in bf16-mixed on
   synthetic WMT-length batches of up to 25,000 tokens per side, 60 warm-up steps over 60 distinct batches, then
   200 timed ones cycling over the same batches (the steady state of a long run: every shape seen before).
   Throughput counts the target tokens that are not padding. Model FLOPs per step = 6 x (encoder parameters x
   source tokens + decoder and output-layer parameters x target tokens) + the attention term
   6 x 2 x d_model x (sum over sentences and layers of Lq x Lk: encoder self, decoder self (causal counted
   in full, as the kernels compute it), cross), over real tokens. MFU = model FLOPs per second over the
   data-sheet dense bf16 peak (989 TFLOP/s, H100/H200 SXM; GPU_CHECK_PEAK_TFLOPS) and over the matmul's rate.
4. The loss must fall: its mean over the last 20 timed steps below that of the first 20 steps by 1 nat
   (0.2 in the CPU dry run's 60 steps of a toy model).

Prints a table and writes OUT_DIR/gpu_check.json. Uses no torch API newer than 2.11.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from transformer_nmt.conf import CONF_DIR
from transformer_nmt.data import synthetic as data_synthetic
from transformer_nmt.model.attention import ATTENTION_KERNELS
from transformer_nmt.model.flops import model_flops  # the one definition, shared with the training run's MFU
from transformer_nmt.provenance import git_state
from transformer_nmt.training.module import TranslationModule

REPO = Path(__file__).resolve().parents[1]
BUDGET_SECONDS = 8 * 60  # the whole check, tests included, on one H200
PEAK_TFLOPS = float(os.environ.get("GPU_CHECK_PEAK_TFLOPS", "989"))  # H100/H200 SXM dense bf16, data sheet
CUDA = torch.cuda.is_available()


def base_model() -> dict:
    """The paper's base model as conf/model/base.yaml sets it (the shape fields this check reports)."""
    from hydra import compose, initialize_config_dir

    from transformer_nmt.training.config import register_configs
    from transformer_nmt.training.resolvers import register_resolvers

    register_configs()  # conf/train.yaml composes over the schemas
    register_resolvers()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        model = compose("train", overrides=["model=base"]).model
    return {key: model[key] for key in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff",
                                        "dropout")}


SIZES = dict(  # the paper's base model and batch on a GPU; a toy on the CPU dry run
    model=base_model(),
    vocab=37000, max_tokens=25000, warmup=60, steps=200, matmul=8192, pairs=200_000, lr_warmup=400, loss_drop=1.0,
) if CUDA else dict(
    model=dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.1),
    vocab=500, max_tokens=600, warmup=20, steps=40, matmul=512, pairs=4000, lr_warmup=60, loss_drop=0.2,
)
# The steps cycle over `warmup` distinct batches, so that every batch shape has run once before the clock starts:
# the timed steps measure the steady state a long run reaches, where each width recurs every epoch. The first
# H200 check (2026-12-04) gave each step a shape not seen before, and the first fused run paid that
# (161 ms a step, against 66 ms for `auto`, which runs the same kernel, measured after it).


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_tests(seconds: int) -> dict:
    """The CUDA-marked tests (on a CPU they skip; the dry run then also runs the sync test's CPU case)."""
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *files]
    if CUDA:
        command[4:4] = ["-m", "cuda"]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=seconds)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        output, code = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    summary = [line for line in output.splitlines() if " passed" in line or " failed" in line or " skipped" in line]
    return {"command": " ".join(command[1:]), "exit": code, "summary": summary[-1] if summary else output[-300:],
            "failures": [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]}


def matmul_tflops(n: int) -> float:
    """Rate of an n^3 matmul (bf16 on CUDA, fp32 on CPU) in TFLOP/s: median of 10 after 3 warm-ups."""
    dtype, device = (torch.bfloat16, "cuda") if CUDA else (torch.float32, "cpu")
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))  # random data: zeros run faster
    times = []
    for i in range(13):
        if CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            t = time.perf_counter()
            a @ b
            seconds = time.perf_counter() - t
        if i >= 3:
            times.append(seconds)
    return 2 * n ** 3 / float(np.median(times)) / 1e12


def synthetic_batches(n_batches: int, seed: int = 0, multiple: int = 1) -> list[dict]:
    """The package's synthetic WMT-length batches at this check's sizes."""
    return data_synthetic.synthetic_batches(n_batches, SIZES["vocab"], SIZES["max_tokens"], SIZES["pairs"], seed,
                                            multiple)


class StepClock(pl.Callback):
    """Times the steps after warm-up (synchronizing the device at both ends only) and reads the loss on the
    steps that log; peak device memory over the whole fit."""

    def __init__(self, warmup: int):
        self.warmup, self.start, self.seconds, self.losses = warmup, None, None, {}

    def on_train_start(self, trainer, pl_module):
        if CUDA:
            torch.cuda.reset_peak_memory_stats()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.warmup and self.start is None:
            if CUDA:
                torch.cuda.synchronize()
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % trainer.log_every_n_steps == 0:
            self.losses[step] = float(trainer.callback_metrics["train/loss"])

    def on_train_end(self, trainer, pl_module):
        if CUDA:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start


def measure(kernel: str, compile_model: bool, batches: list[dict], matmul: float) -> dict:
    torch.manual_seed(0)
    warmup, steps = SIZES["warmup"], SIZES["steps"]
    module = TranslationModule({**SIZES["model"], "vocab_size": SIZES["vocab"], "attention": kernel},
                               {"warmup_steps": SIZES["lr_warmup"], "val_bleu_max_sentences": 0,
                                "compile": compile_model})
    clock = StepClock(warmup)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False, pin_memory=CUDA)
    trainer = pl.Trainer(accelerator="gpu" if CUDA else "cpu", devices=1, precision="bf16-mixed" if CUDA else "32-true",
                         max_steps=warmup + steps, max_epochs=-1, log_every_n_steps=10, logger=False,
                         default_root_dir="/tmp/gpu_check_runs", enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[clock])
    trainer.fit(module, train_dataloaders=loader)
    timed = [batches[i % len(batches)] for i in range(warmup, warmup + steps)]
    tokens = sum(int((b["tgt"][:, 1:] != 0).sum()) for b in timed)
    flops = sum(model_flops(module.model, b) for b in timed) / clock.seconds
    early = [v for s, v in clock.losses.items() if s <= 20]
    late = [v for s, v in clock.losses.items() if s > warmup + steps - 20]
    return {
        "kernel": kernel + (" + compile" if compile_model else ""), "steps": steps,
        "tgt_tokens_per_step": tokens / steps, "tgt_tokens_per_sec": tokens / clock.seconds,
        "ms_per_step": 1000 * clock.seconds / steps, "model_tflops": flops / 1e12,
        "mfu_datasheet": flops / (PEAK_TFLOPS * 1e12), "mfu_matmul": flops / (matmul * 1e12),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if CUDA else None,
        "loss_first": float(np.mean(early)), "loss_last": float(np.mean(late)),
        "loss_falls": float(np.mean(late)) < float(np.mean(early)) - SIZES["loss_drop"],
    }


def main() -> int:
    started = time.perf_counter()
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "outputs/gpu_check"))
    out_dir.mkdir(parents=True, exist_ok=True)
    if not CUDA and os.environ.get("GPU_CHECK_ALLOW_CPU") != "1":
        sys.exit("gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); "
                 "GPU_CHECK_ALLOW_CPU=1 dry-runs the check on the CPU with tiny sizes")
    device = torch.cuda.get_device_name() if CUDA else f"CPU ({platform.processor() or platform.machine()})"
    report = {"date": time.strftime("%Y-%m-%d"), "device": device,
              # the device machine gets the tree without .git: the caller names the commit (GPU_CHECK_COMMIT)
              "commit": os.environ.get("GPU_CHECK_COMMIT") or git_state()["commit"], "torch": torch.__version__,
              "cuda": torch.version.cuda, "python": platform.python_version(), "sizes": SIZES,
              "peak_tflops_datasheet": PEAK_TFLOPS}
    log(f"{device}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    torch.set_float32_matmul_precision("high")
    json_path = out_dir / "gpu_check.json"

    def save() -> None:  # after each stage: a check stopped at its time limit still leaves what it measured
        report["seconds"] = time.perf_counter() - started
        json_path.write_text(json.dumps(report, indent=2) + "\n")

    log("CUDA-marked tests")
    report["tests"] = run_tests(seconds=200)
    save()
    log(f"tests: {report['tests']['summary']}")
    report["matmul_tflops"] = matmul_tflops(SIZES["matmul"])
    log(f"{SIZES['matmul']}^3 matmul: {report['matmul_tflops']:.3g} TFLOP/s")
    batches = {1: synthetic_batches(SIZES["warmup"])}
    kernels = [k for k in ("plain", "fused", "blocked", "auto") if k in ATTENTION_KERNELS]  # auto: the default
    variants = [(k, False) for k in kernels] + ([("fused", True)] if CUDA else [])
    report["runs"] = []
    for kernel, compile_model in variants:
        if compile_model and time.perf_counter() - started > BUDGET_SECONDS - 150:
            log("skipping the compiled run: not enough of the 8-minute budget left")
            continue
        log(f"training the model with attention={kernel}{' (compiled)' if compile_model else ''}")
        try:
            multiple = 8 if compile_model else 1  # train.compile pads to a multiple of 8, so that shapes repeat
            if multiple not in batches:
                batches[multiple] = synthetic_batches(SIZES["warmup"], multiple=multiple)
            report["runs"].append(measure(kernel, compile_model, batches[multiple], report["matmul_tflops"]))
        except Exception as e:  # one failing kernel must not hide the others' numbers
            report["runs"].append({"kernel": kernel + (" + compile" if compile_model else ""), "error": repr(e)[:500]})
        save()
        if CUDA:
            torch.cuda.empty_cache()
    save()
    print_table(report)
    ok = report["tests"]["exit"] == 0 and all(r.get("loss_falls") for r in report["runs"])
    log(f"{'PASS' if ok else 'FAIL'} in {report['seconds']:.0f} s; JSON: {json_path}")
    return 0 if ok else 1


def print_table(report: dict) -> None:
    m = SIZES["model"]
    print(f"\n### GPU check, {report['date']}, {report['device']}, torch {report['torch']}\n")
    print(f"Tests: `{report['tests']['command']}`: {report['tests']['summary']}"
          + "".join(f"\n  {f}" for f in report["tests"]["failures"]))
    print(f"\nd_model {m['d_model']}, {m['n_encoder_layers']}+{m['n_decoder_layers']} layers, d_ff {m['d_ff']}, "
          f"vocab {SIZES['vocab']:,}, batches <= {SIZES['max_tokens']:,} tokens per side, "
          f"{'bf16-mixed' if CUDA else '32-true'}, {SIZES['steps']} steps after {SIZES['warmup']} warm-up; "
          f"{SIZES['matmul']}^3 matmul {report['matmul_tflops']:.3g} TFLOP/s; data-sheet peak {PEAK_TFLOPS:.0f}\n")
    print("| attention | target tokens/s | ms/step | model TFLOP/s | MFU (data sheet) | MFU (matmul) "
          "| peak GiB | loss first 20 -> last 20 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["runs"]:
        if "error" in r:
            print(f"| {r['kernel']} | failed: {r['error'][:120]} | | | | | | |")
            continue
        memory = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "n/a"
        print(f"| {r['kernel']} | {r['tgt_tokens_per_sec']:,.0f} | {r['ms_per_step']:.1f} | {r['model_tflops']:.3g} "
              f"| {100 * r['mfu_datasheet']:.3g}% | {100 * r['mfu_matmul']:.3g}% | {memory} "
              f"| {r['loss_first']:.2f} -> {r['loss_last']:.2f}{'' if r['loss_falls'] else ' (NOT falling)'} |")


if __name__ == "__main__":
    sys.exit(main())
