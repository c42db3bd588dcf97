"""Frozen parameters (``train.freeze``): name patterns whose parameters keep their values through training.

A pattern is an ``fnmatch`` pattern over the model's parameter names as ``named_parameters`` gives them
(``encoder_layers.0.self_attn.in_proj.weight``, ``src_embed.weight``, ...): ``encoder_layers.*`` freezes the
encoder's layers, ``*norm*`` every layer norm, ``decoder_layers.0.*`` the first decoder layer. A tied parameter
(the shared embeddings) is one tensor under several names: a pattern matching any of them freezes it everywhere.
Frozen parameters get ``requires_grad=False``: no gradient, and the optimizer never sees them (no Adam state). A
pattern that matches no parameter is refused, naming it and the names' first components.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn


def freeze(model: nn.Module, patterns: list[str] | tuple[str, ...], option: str = "train.freeze") -> dict[str, int]:
    """Set ``requires_grad=False`` on every parameter of ``model`` a pattern matches; returns {"trainable": n,
    "frozen": n} (parameter counts, each tensor once)."""
    patterns = list(patterns or [])
    names = list(model.named_parameters(remove_duplicate=False))
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{option}: {pattern!r} is not a parameter name pattern")
        if not any(fnmatchcase(name, pattern) for name, _ in names):
            heads = ", ".join(dict.fromkeys(name.split(".")[0] for name, _ in names))
            raise ValueError(f"{option}: {pattern!r} matches no parameter of the model (fnmatch patterns over "
                             f"parameter names, which begin with: {heads}; e.g. 'encoder_layers.*')")
    for name, p in names:
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            p.requires_grad_(False)
    return counts(model)


def counts(model: nn.Module) -> dict[str, int]:
    """{"trainable": n, "frozen": n}: parameter counts, each tensor once."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable": trainable, "frozen": sum(p.numel() for p in model.parameters()) - trainable}
