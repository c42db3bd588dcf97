"""Dropout (section 5.4), with a mask that is cheap to draw on CPU.

Dropout zeroes each element with probability p and scales the rest by 1 / (1 - p). torch's CPU kernel draws
its mask with ``bernoulli_``: one 64-bit draw (two Mersenne-Twister numbers) per element, one thread, which
profiled as a fifth of the CPU recipe's bf16 step (docs/benchmarks.md, "Dropout masks and loss chunks").

On CPU this module draws the same mask from integers instead. For p <= 0.5 one 64-bit draw (``random_`` over
the whole int64 range) gives four independent uniform 16-bit integers u, and an element is dropped when
u < -2^15 + round(p * 2^16): a probability p' within 2^-17 of p, so that the expectation of a kept-and-scaled
element, x * (1 - p') / (1 - p), is within 2^-16 (1.5e-5) of x, far inside bf16's rounding (2^-9). Above 0.5 the
bound 2^-17 / (1 - p) grows, and the draw gives two uniform 32-bit integers instead (u < -2^31 + round(p * 2^32):
within 2^-33 of p). A quarter of a draw per element, and no float comparison (measured against the 32-bit
split and torch's kernel: docs/benchmarks.md, "Dropout from 16-bit integers"). The kept elements are
x * (1 / (1 - p)) rounded once to x's dtype, then multiplied by the exact 0/1 mask, a bool tensor (no float copy
of it). (torch's CPU kernel rounds the scale to x's dtype first, which biases bf16 values up; here the scaled
value is rounded once, as torch's CUDA kernel does.) Other devices use ``F.dropout`` (on CUDA a fused Philox
kernel), and so does code being compiled (``torch.compile`` cannot trace ``random_``; inductor fuses
its own dropout). Both are seeded by torch's generator of the input's device, so a seeded step draws the same
mask every time (the training step seeds each one: training.dropout_seeds).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_SIGNED = {16: torch.int16, 32: torch.int32}  # the integers one 64-bit draw is split into


def check_probability(p: float) -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return p


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of ``x`` with probability ``p``, scale the others by 1 / (1 - p); same shape and dtype."""
    check_probability(p)
    if not training or p == 0.0:
        return x
    bits = 16 if p <= 0.5 else 32  # uniform integers of this width (see the module's docstring)
    threshold = round(p * 2 ** bits)  # drop when a uniform integer is among the lowest `threshold`
    if x.device.type != "cpu" or threshold >= 2 ** bits or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)  # (p within 2^-33 of 1 drops everything, as there)
    n, per_draw = x.numel(), 64 // bits
    draws = torch.empty(-(-n // per_draw), dtype=torch.int64).random_(-(2 ** 63), None)  # 64 random bits each
    uniform = draws.view(_SIGNED[bits])[:n]  # (n,) independent uniform integers in [-2^(bits-1), 2^(bits-1))
    keep = (uniform >= -(2 ** (bits - 1)) + threshold).view(x.shape)  # bool
    return x.mul(1.0 / (1.0 - p)).mul_(keep)


class Dropout(nn.Module):
    """``nn.Dropout``'s behaviour (identity in eval mode), drawn by ``dropout`` above."""

    def __init__(self, p: float):
        super().__init__()
        self.p = check_probability(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
