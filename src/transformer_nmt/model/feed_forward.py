"""The position-wise feed-forward sub-layer (section 3.3) and its gated variants (Shazeer 2020, "GLU Variants
Improve Transformer"), chosen by ``model.activation``:

- plain, two matrices: FFN(x) = act(x W1 + b1) W2 + b2 with act ``relu`` (the paper), ``gelu`` (the exact, erf
  form) or ``swish`` (x sigmoid(x), what opus-mt models use; MarianMT models import exactly with both);
- gated, three matrices: FFN(x) = (act(x W1 + b1) * (x V + c)) W2 + b2, ``swiglu`` (act = swish) or ``geglu``
  (act = gelu, T5's "gated-gelu").

A gated layer of inner width d_ff has 3 d_model d_ff weights where a plain one has 2: at equal parameters its
d_ff is 2/3 of the plain one's (``gated_width``; Shazeer's convention, 3072 -> 2048 there). ``model.d_ff`` is
always the inner width as built, never rescaled behind the user's back.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_nmt.model.dropout import Dropout

# name -> the non-linearity of a plain feed-forward
ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}
# name -> the non-linearity of the gated branch of a gated feed-forward
GATED_ACTIVATIONS = {"swiglu": F.silu, "geglu": F.gelu}
ACTIVATION_NAMES = (*ACTIVATIONS, *GATED_ACTIVATIONS)


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
        self.activation = ACTIVATIONS[activation]
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
        self.activation = GATED_ACTIVATIONS[activation]
        self.dropout = Dropout(dropout)

    def init_weights(self) -> None:
        _xavier_and_zero(self.linear1, self.linear_v, self.linear2)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L, d_model) -> (B, L, d_model), through (B, L, d_ff)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x)) * self.linear_v(x)))


def feed_forward(d_model: int, d_ff: int, activation: str, dropout: float = 0.0) -> nn.Module:
    """The feed-forward sub-layer that ``activation`` names (``ACTIVATION_NAMES``)."""
    if activation in ACTIVATIONS:
        return FeedForward(d_model, d_ff, activation, dropout)
    if activation in GATED_ACTIVATIONS:
        return GatedFeedForward(d_model, d_ff, activation, dropout)
    raise ValueError(f"model.activation must be one of {ACTIVATION_NAMES}, got {activation!r}")
