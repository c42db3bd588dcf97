"""What a model computes beyond its weights: forward hooks that others attached (analysis/head_gates.py's head
gates), which a file of the weights (an export, a checkpoint) would silently drop."""

from __future__ import annotations

from torch import nn


def hooked_modules(model: nn.Module) -> list[str]:
    """Names of ``model``'s modules that carry forward hooks or pre-hooks ("the model" for the model itself)."""
    return [name or "the model" for name, module in model.named_modules()
            if module._forward_pre_hooks or module._forward_hooks]
