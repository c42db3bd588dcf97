"""The normalisation around every sub-layer (section 3.1), chosen by ``model.norm``:

- ``layernorm``: (x - mean) / sqrt(var + eps) * gamma + beta over d_model (Ba et al. 2016; the paper);
- ``rmsnorm``: x / sqrt(mean(x^2) + eps) * gamma, no centring and no bias (Zhang & Sennrich 2019).

Both are torch's own modules (``nn.LayerNorm``, ``nn.RMSNorm``); ``NORM_EPS`` holds each one's eps: torch's
LayerNorm default, and the 1e-6 of T5 and LLaMA for RMSNorm (torch's RMSNorm default, the dtype's machine
epsilon, would change with the precision).
"""

from __future__ import annotations

from torch import nn

NORMS = ("layernorm", "rmsnorm")
NORM_EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6}


def norm(kind: str, d_model: int) -> nn.Module:
    """A fresh normalisation of ``kind`` over the last dimension, d_model: gamma starts at 1 (and beta at 0)."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=NORM_EPS[kind])
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=NORM_EPS[kind])
    raise ValueError(f"model.norm must be one of {NORMS}, got {kind!r}")
