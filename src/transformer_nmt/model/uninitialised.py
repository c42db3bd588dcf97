"""A model built without initialising its weights: for a reader that is about to replace them.

Building a Transformer initialises every weight (each torch layer's ``reset_parameters``, then the model's
``init_weights``): random draws over every parameter, thrown away when a checkpoint's weights are loaded. On the
meta device those draws run through torch's Python reference kernels, whose first use imports ``torch._dynamo``
(seconds of a cold start; model/positions.py leaves its tables empty there for the same reason). Under
``skip_weight_init()`` every ``torch.nn.init`` function and a tensor's random fills (``uniform_``, ``normal_``,
where the initialisers end) return their tensor untouched: parameters keep what ``torch.empty`` gave them (on the
meta device, nothing), while what a module computes in its constructor (the sinusoid and rotary tables, buffers
a checkpoint does not hold) is built as always. Whoever uses it must overwrite every parameter (a strict
``load_state_dict``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# What initialises weights: nn.init's public in-place functions (those that dispatch to a mode; the others end in
# a tensor's own random fill), and the random fills themselves, which every random initialiser ends in.
INITIALISERS = frozenset([*(getattr(nn.init, name) for name in (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")),
    torch.Tensor.uniform_, torch.Tensor.normal_])


class _SkipInit(TorchFunctionMode):
    """Returns the tensor an ``nn.init`` initialiser is given, untouched; every other function runs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@contextmanager
def skip_weight_init() -> Iterator[None]:
    """Inside: ``nn.init``'s initialisers leave their tensors as they are (see the module's docstring)."""
    with _SkipInit():
        yield


def uninitialised(module_class: type[nn.Module], *args, device: str | torch.device | None = None,
                  **kwargs) -> nn.Module:
    """``module_class(*args, **kwargs)`` built with its weights left uninitialised, on ``device`` (``"meta"``:
    shapes only) or the default device."""
    with torch.device(device) if device is not None else nullcontext(), skip_weight_init():
        return module_class(*args, **kwargs)

