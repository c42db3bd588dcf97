"""Head gates: each attention head's output multiplied by a gate (1 = on, 0 = off) at evaluation, the tool of
head importance (heads.py, after Michel et al. 2019) and of the explorer's pruning (explore.py).

The model knows nothing of them: a gate is a forward pre-hook on the attention's output projection W_O
(``HeadGate``), whose input is the heads' outputs side by side (B, L, h d_v), that scales each head's d_v columns.
``set_gates`` attaches and removes the hooks; ``fold_gates`` multiplies them into W_O's columns for good (a pruned
model to save or export: the same outputs, no hooks; the exports refuse a model with hooks).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_nmt.model.attention import MultiHeadAttention
from transformer_nmt.model.transformer import Transformer

KINDS = ("encoder", "decoder", "cross")  # encoder self-attention, decoder self-attention, cross-attention


class HeadGate:
    """The forward pre-hook of one attention's W_O: scales head i's d_v input columns by ``gates[i]``. It lives in
    the module's own hooks (so a deepcopy of the model keeps it) and follows the heads' device and dtype."""

    def __init__(self, gates: Tensor, d_v: int):
        self.gates = gates  # (h,)
        self.columns = gates.repeat_interleave(d_v)  # (h d_v,)

    def __call__(self, _, inputs):
        heads = inputs[0]  # (B, L, h d_v)
        return (heads * self.columns.to(heads),)


def _gate_of(module: MultiHeadAttention) -> tuple[int, HeadGate] | None:
    """(hook id, HeadGate) of ``module``'s W_O, or None."""
    return next(((key, hook) for key, hook in module.out_proj._forward_pre_hooks.items()
                 if isinstance(hook, HeadGate)), None)


def attention_modules(model: Transformer, kind: str) -> list[MultiHeadAttention]:
    """The attention modules of one kind, one per layer: "encoder", "decoder" (self) or "cross"."""
    if kind == "encoder":
        return [layer.self_attn for layer in model.encoder_layers]
    if kind == "decoder":
        return [layer.self_attn for layer in model.decoder_layers]
    if kind == "cross":
        return [layer.cross_attn for layer in model.decoder_layers]
    raise ValueError(f"attention kind must be one of {KINDS}, got {kind!r}")


def all_heads(model: Transformer) -> list[tuple[str, int, int]]:
    """Every head as (kind, layer, head), in KINDS, layer and head order."""
    return [(kind, layer, head) for kind in KINDS for layer, module in enumerate(attention_modules(model, kind))
            for head in range(module.n_heads)]


def set_layer_gates(module: MultiHeadAttention, gates: Tensor | None) -> None:
    """Multiply each head's output of one attention module by ``gates`` (h,); None removes its gates."""
    found = _gate_of(module)
    if found is not None:
        del module.out_proj._forward_pre_hooks[found[0]]
    if gates is None:
        return
    gates = torch.as_tensor(gates, dtype=torch.float32)
    if gates.shape != (module.n_heads,):
        raise ValueError(f"gates must have shape ({module.n_heads},), got {tuple(gates.shape)}")
    module.out_proj.register_forward_pre_hook(HeadGate(gates, module.d_v))


def set_gates(model: Transformer, removed: set[tuple[str, int, int]]) -> None:
    """Gate off exactly the heads in ``removed``, (kind, layer, head) each; every other head on."""
    for kind in KINDS:
        for layer, module in enumerate(attention_modules(model, kind)):
            off = [h for h in range(module.n_heads) if (kind, layer, h) in removed]
            set_layer_gates(module, None if not off else
                            torch.tensor([0.0 if h in off else 1.0 for h in range(module.n_heads)]))


def gates(model: Transformer) -> dict[str, Tensor]:
    """The gates in force, 1 where none is set. kind -> (layers, heads), float32 on the CPU."""
    return {kind: torch.stack([found[1].gates.float().cpu() if (found := _gate_of(m)) else torch.ones(m.n_heads)
                               for m in attention_modules(model, kind)]) for kind in KINDS}


@torch.no_grad()
def fold_gates(model: Transformer) -> None:
    """Multiply every gate into its W_O columns and remove the hooks: the model computes what it computed gated,
    with no gates left (a pruned model to save, export or share)."""
    for kind in KINDS:
        for module in attention_modules(model, kind):
            found = _gate_of(module)
            if found is not None:
                module.out_proj.weight.mul_(found[1].columns.to(module.out_proj.weight))
                set_layer_gates(module, None)
