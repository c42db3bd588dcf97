"""The position-wise feed-forward sub-layer (section 3.3) and its gated variants (Shazeer 2020, "GLU Variants
Improve Transformer"), chosen by ``model.activation``:

- plain, two matrices: FFN(x) = act(x W1 + b1) W2 + b2 with act ``relu`` (the paper), ``gelu`` (the exact, erf
  form) or ``swish`` (x sigmoid(x), what opus-mt models use; MarianMT models import exactly with both);
- gated, three matrices: FFN(x) = (act(x W1 + b1) * (x V + c)) W2 + b2, ``swiglu`` (act = swish) or ``geglu``
  (act = gelu, T5's "gated-gelu").

A gated layer of inner width d_ff has 3 d_model d_ff weights where a plain one has 2: at equal parameters its
d_ff is 2/3 of the plain one's (``gated_width``; Shazeer's convention, 3072 -> 2048 there). ``model.d_ff`` is
always the inner width as built, never rescaled behind the user's back.

Each value of ``model.activation`` is an ``Activation`` in ``ACTIVATIONS``: its function, whether it is gated,
and its form in each export format (model/export_forms.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_nmt.model.dropout import Dropout
from transformer_nmt.model.export_forms import NoForm


@dataclass(frozen=True)
class Activation:
    """One value of ``model.activation``: the non-linearity (of the gated branch, where gated), and how each
    exporter writes it (model/export_forms.py: a form, ``NoForm(why)``, or None: not stated, refused)."""

    function: Callable[[Tensor], Tensor]
    gated: bool = False  # three matrices (GatedFeedForward): act(x W1) * (x V), then W2
    ctranslate2: str | NoForm | None = None  # the ctranslate2.specs.Activation member (a gated one: with ffn_glu)
    marian: str | NoForm | None = None  # transformers' activation_function (MarianConfig)


_GATED = NoForm("MarianMTModel's feed-forward has two matrices and one of relu, swish, gelu; a gated one cannot "
                "be exported")
ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(F.relu, ctranslate2="RELU", marian="relu"),
    "swish": Activation(F.silu, ctranslate2="SWISH", marian="swish"),
    "gelu": Activation(F.gelu, ctranslate2="GELU", marian="gelu"),
    "swiglu": Activation(F.silu, gated=True, ctranslate2="SWISH", marian=_GATED),
    "geglu": Activation(F.gelu, gated=True, ctranslate2="GELU", marian=_GATED),
}


def gated_width(d_ff: int, multiple: int = 8) -> int:
    """The inner width of a gated feed-forward with about the weights of a plain one of inner width ``d_ff``:
    2/3 d_ff, rounded to a ``multiple`` (2048 -> 1368, 1024 -> 680, 256 -> 168)."""
    return max(multiple, round(2 * d_ff / 3 / multiple) * multiple)


def _xavier_and_zero(*linears: nn.Linear) -> None:
    for linear in linears:
        nn.init.xavier_uniform_(linear.weight)
        nn.init.zeros_(linear.bias)


class FeedForward(nn.Module):
    """Section 3.3: act(x W1 + b1) W2 + b2, with optional dropout on the hidden activations (``dropout``; the
    paper has none)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)  # W1: (d_ff, d_model)
        self.linear2 = nn.Linear(d_ff, d_model)  # W2: (d_model, d_ff)
        self.activation = ACTIVATIONS[activation].function
        self.dropout = Dropout(dropout)

    def init_weights(self) -> None:
        _xavier_and_zero(self.linear1, self.linear2)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L, d_model) -> (B, L, d_model), through (B, L, d_ff)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class GatedFeedForward(nn.Module):
    """(act(x W1 + b1) * (x V + c)) W2 + b2: ``linear1`` is W1 (through the non-linearity), ``linear_v`` the
    linear branch V, ``linear2`` W2; dropout on the gated hidden activations (``dropout``)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "swiglu", dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)  # W1: (d_ff, d_model)
        self.linear_v = nn.Linear(d_model, d_ff)  # V: (d_ff, d_model)
        self.linear2 = nn.Linear(d_ff, d_model)  # W2: (d_model, d_ff)
        self.activation = ACTIVATIONS[activation].function
        self.dropout = Dropout(dropout)

    def init_weights(self) -> None:
        _xavier_and_zero(self.linear1, self.linear_v, self.linear2)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L, d_model) -> (B, L, d_model), through (B, L, d_ff)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x)) * self.linear_v(x)))


def feed_forward(d_model: int, d_ff: int, activation: str, dropout: float = 0.0) -> nn.Module:
    """The feed-forward sub-layer that ``activation`` names (``ACTIVATIONS``)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"model.activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    layer = GatedFeedForward if ACTIVATIONS[activation].gated else FeedForward
    return layer(d_model, d_ff, activation, dropout)
