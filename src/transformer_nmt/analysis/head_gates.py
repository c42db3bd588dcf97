"""Head gates: each attention head's output multiplied by a gate (1 = on, 0 = off) at evaluation, the tool of
head importance (heads.py, after Michel et al. 2019) and of the explorer's pruning (explore.py).

The model knows nothing of them: a gate is a forward pre-hook on the attention's output projection W_O, whose
input is the heads' outputs side by side (B, L, h d_v), that scales each head's d_v columns. ``set_gates``
attaches and removes the hooks; ``fold_gates`` multiplies them into W_O's columns for good (a pruned model to
save or export: the same outputs, no hooks).
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from transformer_nmt.model.attention import MultiHeadAttention
from transformer_nmt.model.transformer import Transformer

KINDS = ("encoder", "decoder", "cross")  # encoder self-attention, decoder self-attention, cross-attention
# attention module -> (its gates (h,), the hook's handle); weak: a model that goes takes its entries along
_GATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    if module in _GATES:
        _GATES.pop(module)[1].remove()
    if gates is None:
        return
    gates = torch.as_tensor(gates, dtype=torch.float32, device=module.out_proj.weight.device)
    if gates.shape != (module.n_heads,):
        raise ValueError(f"gates must have shape ({module.n_heads},), got {tuple(gates.shape)}")
    columns = gates.repeat_interleave(module.d_v)  # (h d_v,): head i's d_v columns of W_O's input

    def gate(_, inputs):
        heads = inputs[0]  # (B, L, h d_v)
        return (heads * columns.to(heads.dtype),)

    _GATES[module] = (gates, module.out_proj.register_forward_pre_hook(gate))


def set_gates(model: Transformer, removed: set[tuple[str, int, int]]) -> None:
    """Gate off exactly the heads in ``removed``, (kind, layer, head) each; every other head on."""
    for kind in KINDS:
        for layer, module in enumerate(attention_modules(model, kind)):
            off = [h for h in range(module.n_heads) if (kind, layer, h) in removed]
            set_layer_gates(module, None if not off else
                            torch.tensor([0.0 if h in off else 1.0 for h in range(module.n_heads)]))


def gates(model: Transformer) -> dict[str, Tensor]:
    """The gates in force, 1 where none is set. kind -> (layers, heads), float32 on the CPU."""
    return {kind: torch.stack([_GATES[m][0].float().cpu() if m in _GATES else torch.ones(m.n_heads)
                               for m in attention_modules(model, kind)]) for kind in KINDS}


@torch.no_grad()
def fold_gates(model: Transformer) -> None:
    """Multiply every gate into its W_O columns and remove the hooks: the model computes what it computed gated,
    with no gates left (a pruned model to save, export or share)."""
    for kind in KINDS:
        for module in attention_modules(model, kind):
            if module in _GATES:
                layer_gates = _GATES[module][0]
                module.out_proj.weight.mul_(layer_gates.repeat_interleave(module.d_v).to(module.out_proj.weight))
                set_layer_gates(module, None)
