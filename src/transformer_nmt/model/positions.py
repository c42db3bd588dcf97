"""Where a token is: the order information a Transformer has no other way to see (section 3.5).

Two families, chosen by ``model.positions``:

- absolute: a vector per position added to the token embeddings before the first layer. ``sinusoidal``, the
  paper's fixed table; ``learned``, a trained table (Table 3, row E).
- relative: ``rotary`` (RoFormer, Su et al. 2021) adds nothing to the embeddings; it rotates each self-attention
  query and key by an angle proportional to its position, so that a query-key product depends on the positions
  only through their difference. It never touches cross-attention (source and target positions are unrelated).

``none`` adds nothing anywhere: an encoder without positions sees a bag of tokens, and a decoder only the order
its causal mask leaves (the ablation that shows what positions are worth).

Each absolute module maps (B, L, d_model) embeddings at positions offset..offset+L-1 to the same shape; the
rotary module maps (B, h, L, d_k) queries or keys the same way. Tables that are functions of the config are
buffers that are not saved (checkpoints stay small; DDP need not broadcast them).

Each value of ``model.positions`` is a ``PositionScheme`` in ``POSITION_SCHEMES``: the module it adds to the
embeddings, whether self-attention rotates, and its form in each export format (model/export_forms.py). A new
scheme is a module that defines its class and calls ``register_positions``, imported once by model/transformer.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer_nmt.model.export_forms import NoForm

ROTARY_BASE = 10000.0  # theta of RoFormer's frequencies base^(-2i/d), as the sinusoids' 10000


def sinusoidal_positions(max_positions: int, d_model: int) -> Tensor:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same). (max_positions, d_model)"""
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)  # (P, d/2)
    table[:, 1::2] = torch.cos(position * inv_freq)[:, : d_model // 2]
    return table


class SinusoidalPositions(nn.Module):
    """x + PE[offset : offset + L]: the paper's fixed table (``table``, a buffer that is not saved)."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_positions(max_positions, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.table[offset:offset + x.shape[1]]  # (B, L, d_model)


class LearnedPositions(nn.Module):
    """x + W[offset : offset + L]: a trained (max_positions, d_model) table, ``weight`` (row E)."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))

    @property
    def table(self) -> Tensor:
        """The (max_positions, d_model) table added to the embeddings (what an export writes)."""
        return self.weight

    def init_weights(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.weight.shape[1] ** -0.5)  # as the token embeddings start

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.weight[offset:offset + x.shape[1]]  # (B, L, d_model)


class NoPositions(nn.Module):
    """Adds nothing: the embeddings of ``rotary`` (whose positions live in the attention) and ``none``."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x


class RotaryPositions(nn.Module):
    """RoFormer's rotation of queries and keys, in the "rotate half" layout: feature i and feature i + d/2 form
    the pair that rotates by angle pos * base^(-2i/d) (GPT-NeoX's and LLaMA's layout; CTranslate2's
    ``rotary_interleave=False``). Then (R_m q) . (R_n k) = q . R_(n-m) k: attention sees relative positions.

    ``cos`` and ``sin`` are (max_positions, d) tables, each half repeated, that are not saved."""

    def __init__(self, max_positions: int, d_head: int, base: float = ROTARY_BASE):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary positions rotate pairs of features: d_k must be even, got {d_head}")
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (d/2,)
        angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq  # (P, d/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, d): pair (i, i + d/2) shares angle i
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, h, L, d) at positions offset..offset+L-1 -> rotated, same shape and dtype."""
        length, half = x.shape[-2], x.shape[-1] // 2
        cos = self.cos[offset:offset + length].to(x.dtype)  # (L, d)
        sin = self.sin[offset:offset + length].to(x.dtype)
        rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (x1, x2) -> (-x2, x1)
        return x * cos + rotated_half * sin


@dataclass(frozen=True)
class PositionScheme:
    """One value of ``model.positions``: what it builds, and how each exporter writes it (model/export_forms.py:
    a form, ``NoForm(why)``, or None: not stated, refused)."""

    embeddings: Callable[[int, int], nn.Module]  # (max_positions, d_model) -> adds positions to the embeddings
    rotary: bool = False  # self-attention rotates its queries and keys (RotaryPositions)
    # "table": the embeddings module's ``table`` (max_positions, d_model), given as CTranslate2's position
    # encodings | "rotary": CTranslate2's rotary embeddings over every feature, halves paired, base ROTARY_BASE
    ctranslate2: str | NoForm | None = None
    # "sinusoidal": MarianMT's own sinusoids (the paper's table, its model dimension permuted: interchange/marian.py)
    marian: str | NoForm | None = None


POSITION_SCHEMES: dict[str, PositionScheme] = {}


def register_positions(name: str, scheme: PositionScheme) -> None:
    """Make ``model.positions=name`` build ``scheme`` (a name is registered once)."""
    if name in POSITION_SCHEMES:
        raise ValueError(f"model.positions={name} is registered twice")
    POSITION_SCHEMES[name] = scheme


def _no_positions(max_positions: int, d_model: int) -> nn.Module:
    return NoPositions()


_MARIAN = NoForm("MarianMTModel has sinusoidal positions only (learned, rotary and no positions cannot be exported)")
register_positions("sinusoidal", PositionScheme(SinusoidalPositions, ctranslate2="table", marian="sinusoidal"))
register_positions("learned", PositionScheme(LearnedPositions, ctranslate2="table", marian=_MARIAN))
register_positions("rotary", PositionScheme(_no_positions, rotary=True, ctranslate2="rotary", marian=_MARIAN))
register_positions("none", PositionScheme(_no_positions, marian=_MARIAN, ctranslate2=NoForm(
    "CTranslate2's Transformer always adds positions (a table, or rotary in the self-attention); translate with "
    "PyTorch (engine=native)")))


def position_scheme(kind: str) -> PositionScheme:
    """The registered scheme of ``model.positions=kind``; a ValueError naming the option and the choices."""
    if kind not in POSITION_SCHEMES:
        raise ValueError(f"model.positions must be one of {tuple(POSITION_SCHEMES)}, got {kind!r}")
    return POSITION_SCHEMES[kind]


def absolute_positions(kind: str, max_positions: int, d_model: int) -> nn.Module:
    """The module that adds ``kind``'s positions to the embeddings (NoPositions for rotary and none)."""
    return position_scheme(kind).embeddings(max_positions, d_model)


def rotary_positions(kind: str, max_positions: int, d_k: int) -> RotaryPositions | None:
    """The rotation every self-attention applies to its queries and keys, or None where ``kind`` does not rotate."""
    return RotaryPositions(max_positions, d_k) if position_scheme(kind).rotary else None
