"""Dropout (section 5.4), with a mask that is cheap to draw on CPU.

Dropout zeroes each element with probability p and scales the rest by 1 / (1 - p). torch's CPU kernel draws
its mask with ``bernoulli_``: one 64-bit draw (two Mersenne-Twister numbers) per element, one thread, which
profiled as a fifth of the CPU recipe's bf16 step (docs/benchmarks.md, "Dropout masks and loss chunks").

On CPU this module draws the same mask from integers instead: one 64-bit draw (``random_`` over the whole
int64 range) gives two independent uniform 32-bit integers u, and an element is dropped when
u < -2^31 + round(p * 2^32), a probability within 2^-33 of p: half the draws, and no float comparison. The
kept elements are x * (1 / (1 - p)) rounded once to x's dtype, then multiplied by an exact 0/1 mask. (torch's
CPU kernel rounds the scale to x's dtype first, which biases bf16 values up; here the scaled value is rounded
once, as torch's CUDA kernel does.) Other devices use ``F.dropout`` (on CUDA a fused
Philox kernel), and so does code being compiled (``torch.compile`` cannot trace ``random_``; inductor fuses
its own dropout). Both are seeded by torch's generator of the input's device, so a seeded step draws the same
mask every time (the training step seeds each one: training.dropout_seed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_INT32_MIN = -(2 ** 31)


def check_probability(p: float) -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return p


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of ``x`` with probability ``p``, scale the others by 1 / (1 - p); same shape and dtype."""
    check_probability(p)
    if not training or p == 0.0:
        return x
    threshold = round(p * 2 ** 32)  # drop when a uniform 32-bit integer is among the lowest `threshold`
    if x.device.type != "cpu" or threshold >= 2 ** 32 or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)  # (p within 2^-33 of 1 drops everything, as there)
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int64).random_(-(2 ** 63), None)  # (ceil(n/2),) 64 random bits
    uniform = bits.view(torch.int32)[:n]  # (n,) independent uniform integers in [-2^31, 2^31)
    keep = (uniform >= _INT32_MIN + threshold).view(x.shape).to(x.dtype)  # exact 0 / 1
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
