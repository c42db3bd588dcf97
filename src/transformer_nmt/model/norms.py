"""The normalisation around every sub-layer (section 3.1), chosen by ``model.norm``:

- ``layernorm``: (x - mean) / sqrt(var + eps) * gamma + beta over d_model (Ba et al. 2016; the paper);
- ``rmsnorm``: x / sqrt(mean(x^2) + eps) * gamma, no centring and no bias (Zhang & Sennrich 2019).

Both are torch's own modules (``nn.LayerNorm``, ``nn.RMSNorm``); each ``Norm`` of ``NORMS`` holds its eps: torch's
LayerNorm default, and the 1e-6 of T5 and LLaMA for RMSNorm (torch's RMSNorm default, the dtype's machine
epsilon, would change with the precision).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from transformer_nmt.model.export_forms import NoForm


@dataclass(frozen=True)
class Norm:
    """One value of ``model.norm``: its module class (built as ``module(d_model, eps=eps)``), its eps, and how each
    exporter writes it (model/export_forms.py: a form, ``NoForm(why)``, or None: not stated, refused)."""

    module: Callable[..., nn.Module]
    eps: float
    ctranslate2: str | NoForm | None = None  # "layer_norm" (gamma, beta) | "rms_norm" (gamma: CTranslate2's rms_norm)
    marian: str | NoForm | None = None  # "layer_norm": MarianMTModel's LayerNorm (weight, bias)


NORMS: dict[str, Norm] = {
    "layernorm": Norm(nn.LayerNorm, 1e-5, ctranslate2="layer_norm", marian="layer_norm"),
    "rmsnorm": Norm(nn.RMSNorm, 1e-6, ctranslate2="rms_norm", marian=NoForm("MarianMTModel has LayerNorm only")),
}


def norm(kind: str, d_model: int) -> nn.Module:
    """A fresh normalisation of ``kind`` over the last dimension, d_model: gamma starts at 1 (and beta at 0)."""
    if kind not in NORMS:
        raise ValueError(f"model.norm must be one of {tuple(NORMS)}, got {kind!r}")
    return NORMS[kind].module(d_model, eps=NORMS[kind].eps)
