"""``trainer.precision=auto``: bf16 mixed precision where the hardware computes in bf16, fp16 mixed precision
on older CUDA GPUs, fp32 elsewhere.

bf16 autocast pays on CUDA devices with native bf16 (Ampere and newer) and on CPUs with native bf16
instructions (AVX512-BF16 or AMX). Pre-Ampere GPUs (V100, T4) would emulate bf16
(``torch.cuda.is_bf16_supported(including_emulation=False)``, torch 2.4+, tells them apart); their tensor cores
compute in fp16, so auto picks 16-mixed (fp16 autocast with a gradient scaler) there. On other CPUs (AVX2
laptops and servers) PyTorch emulates bf16 arithmetic: a training step is many times slower than in fp32
(docs/benchmarks.md, "Precision on a CPU"), so auto picks 32-true there.

The environment variable ``TRANSFORMER_NMT_CPU_BF16=native|emulated`` makes the CPU answer as one with
or without native bf16, whatever its flags: the test suite runs auto's CPU branch both ways on any machine.

A config value may depend on the precision the run trains in (``auto`` resolved):
``max_tokens: ${by_precision:{32-true: 1024, bf16-mixed: 4096}}``, so that a recipe sizes its batches and
schedule to what the hardware computes in; a command-line override replaces the choice as any value.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.hardware import NATIVE_BF16_CPU_FLAGS, cpu_native_bf16


def trainer_precision(cfg: DictConfig) -> tuple[str, str]:
    """(Lightning precision, why): trainer.precision, with ``auto`` resolved for trainer.accelerator."""
    return resolve_precision(str(cfg.trainer.precision), str(cfg.trainer.get("accelerator", "auto")))


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a Lightning precision runs the matrix products in: bf16 or fp16 under mixed precision."""
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(str(precision), torch.float32)


def uses_cuda(accelerator: str) -> bool:
    """Whether a Trainer built with ``accelerator`` runs on CUDA devices."""
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(precision: str, accelerator: str) -> tuple[str, str]:
    """(the Lightning precision to train in, why). Any precision but ``auto`` is kept as it is."""
    if precision != "auto":
        return precision, "set in trainer.precision"
    if uses_cuda(accelerator):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16-mixed", f"auto: {torch.cuda.get_device_name()} supports bf16"
        if torch.cuda.is_available():  # pre-Ampere (V100, T4): bf16 would be emulated; their tensor cores are fp16
            return "16-mixed", (f"auto: {torch.cuda.get_device_name()} has no native bf16 (pre-Ampere); fp16 "
                                f"autocast with a gradient scaler runs on its tensor cores")
        return "32-true", "auto: no CUDA device is visible"
    native, evidence = cpu_native_bf16()
    if native:
        return "bf16-mixed", f"auto: the CPU has native bf16 ({evidence})"
    return "32-true", (f"auto: the CPU has no native bf16 ({evidence or ' or '.join(NATIVE_BF16_CPU_FLAGS)}), "
                       f"where bf16 autocast is emulated and slower than fp32")


def by_precision(choices: dict, *, _root_: DictConfig):
    """The ``${by_precision:{PRECISION: VALUE, ...}}`` resolver: the value for the precision the run trains in,
    ``trainer.precision`` with ``auto`` resolved for ``trainer.accelerator`` (``32`` is ``32-true``)."""
    trainer = _root_.get("trainer") or {}
    precision, why = resolve_precision(str(trainer.get("precision", "auto")), str(trainer.get("accelerator", "auto")))
    precision = "32-true" if precision == "32" else precision
    if not isinstance(choices, dict) or precision not in choices:
        raise ValueError(f"by_precision: no value for {precision} ({why}) among {choices}; add one, set "
                         f"trainer.precision to one of {sorted(choices) if isinstance(choices, dict) else []}, "
                         f"or override the key")
    return choices[precision]


def precision_dependent(cfg: DictConfig) -> dict[str, object]:
    """``{dotted key: value}`` of every setting of ``cfg`` that ``${by_precision:...}`` chose (for the summary)."""
    def raw(node, prefix: str = ""):  # (dotted key, unresolved value) of every leaf
        for key, value in node.items():
            yield from raw(value, f"{prefix}{key}.") if isinstance(value, dict) else [(f"{prefix}{key}", value)]

    return {key: OmegaConf.select(cfg, key) for key, value in sorted(raw(OmegaConf.to_container(cfg, resolve=False)))
            if isinstance(value, str) and value.startswith("${by_precision:")}


