"""Training that met a value that is not finite (NaN or inf) stops, naming where: the first optimizer step whose
loss or gradient was not finite (noted on the device, read where values are read anyway), weights that are not
finite (never saved), and final validation or test losses that are not (no results written)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


class NonFiniteError(RuntimeError):
    """Training met a loss or gradient that is not finite (NaN or inf); the message names the optimizer step and
    the last finite checkpoint."""


def first_non_finite(tensors: dict[str, Tensor]) -> str | None:
    """The name of the first floating-point tensor of ``tensors`` holding NaN or inf, None where all are finite
    (one host read when they are: a single reduction over all of them)."""
    weights = {name: value for name, value in tensors.items() if value.is_floating_point()}
    if not weights or torch.stack([torch.isfinite(value).all() for value in weights.values()]).all():
        return None
    return next(name for name, value in weights.items() if not torch.isfinite(value).all())


class FirstNonFiniteStep:
    """The first optimizer step of a fit whose loss or gradient norm is not finite, kept on the device: noting a
    step never waits for it (``note``), reading it is one host read of a device scalar (``check``)."""

    def __init__(self):
        self.step = None  # () int64 on the device: the first optimizer step not finite (-1: none yet)

    def note(self, sums: Tensor, grad_norm: Tensor, step: int, scaled: bool) -> None:
        """Remember optimizer step ``step`` if its loss and nll sums (``sums[2:]``) are not finite, or its gradient
        norm. Under a gradient scaler (``scaled``: 16-mixed) an inf gradient is the scaler's overflow, whose step it
        skips (lowering the scale): only the loss counts there."""
        bad = ~torch.isfinite(sums[2:]).all()
        if not scaled:
            bad = bad | ~torch.isfinite(grad_norm)
        if self.step is None:
            self.step = torch.full((), -1, dtype=torch.long, device=sums.device)
        self.step.masked_fill_(bad & (self.step < 0), step)

    def check(self, trainer) -> None:
        """``NonFiniteError`` if a step was noted, naming it and the last checkpoint written (the first of
        ``trainer``'s callbacks that records its ``path`` and ``saved_step``), which holds finite weights (every
        save checks them)."""
        if self.step is None:
            return
        step = int(self.step)
        if step < 0:
            return
        last = next((c for c in trainer.callbacks if hasattr(c, "saved_step") and hasattr(c, "path")), None)
        kept = (f"the last checkpoint, {last.path} (step {last.saved_step}), holds finite weights: resume from it "
                f"with other settings" if last is not None and last.saved_step is not None
                else "no checkpoint was written after it")
        raise NonFiniteError(f"training stopped: the loss or the gradient of optimizer step {step} is not finite "
                             f"(NaN or inf); {kept}. Lower the learning rate (train.lr, train.lr_factor), lengthen "
                             f"train.warmup_steps, set train.clip_grad_norm, or train in 32-true or bf16-mixed "
                             f"(trainer.precision)")


def check_final_losses(metrics: dict, step: int) -> None:
    """``NonFiniteError`` where a validation or test loss of ``metrics`` (the run's last, after optimizer step
    ``step``) is not finite: finite weights (checked at the fit's end) that still score NaN; nothing of the run is
    summarized."""
    losses = {key: float(value) for key, value in metrics.items() if key.endswith("/loss") and key[:4] != "train"}
    bad = {key: value for key, value in losses.items() if not math.isfinite(value)}
    if bad:
        raise NonFiniteError(f"the final weights' {', '.join(f'{k} is {v}' for k, v in bad.items())} (not finite) "
                             f"after optimizer step {step}: results.json is not written")
