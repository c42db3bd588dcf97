"""An exponential moving average of the weights (``train.ema_decay``): the weights that validation, the run's test
and every checkpoint's ``state_dict`` (what translate, evaluate, average and export read) hold.

After optimizer step t (t = 1, 2, ...) every trainable parameter's average moves toward it:
ema <- ema + (1 - d_t) * (w - ema), with d_t = decay, or with ``train.ema_warmup`` d_t = min(decay, (1 + t) / (10 + t))
(the ramp of TensorFlow's ExponentialMovingAverage with num_updates: early averages do not hold on to the random
initial weights). The average starts at the weights the fit starts from. It lives on the training device in the
parameters' dtype, and is updated with one ``_foreach_lerp_`` whose weight is a Python number: no host sync. Under
DDP every rank updates its own copy from the same weights, so every rank holds the same average.

A checkpoint keeps both: ``state_dict`` the averaged weights (its decoding weights), ``raw_state_dict`` the
trained ones, with ``ema`` ({decay, warmup, updates}); a resume loads the raw weights into the model and the
average from ``state_dict``, so that it continues exactly (tests/test_ema.py).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor, nn

from transformer_nmt.checkpoint import CKPT_RAW_WEIGHTS

CKPT_EMA = "ema"  # {"decay", "warmup", "updates"}


def check_decay(decay: float) -> float:
    """``train.ema_decay`` as a decay: in (0, 1), or refused naming the option."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"train.ema_decay must be in (0, 1), got {decay}")
    return decay


class WeightEMA:
    """The moving average of ``module``'s trainable parameters, by their ``named_parameters`` names (for a
    LightningModule, the names of its state_dict: "model....")."""

    def __init__(self, module: nn.Module, decay: float, warmup: bool = True):
        self.decay, self.warmup, self.updates = float(check_decay(decay)), bool(warmup), 0
        by_tensor: dict[int, tuple[nn.Parameter, list[str]]] = {}  # a tied parameter is one tensor, several names
        for name, p in module.named_parameters(remove_duplicate=False):
            if p.requires_grad:
                by_tensor.setdefault(id(p), (p, []))[1].append(name)
        self.params = [p for p, _ in by_tensor.values()]
        self.aliases = [names for _, names in by_tensor.values()]  # every name of each parameter
        self.names = [names[0] for names in self.aliases]
        self.average = [p.detach().clone() for p in self.params]  # same device and dtype as the parameters
        self._swapped = None  # the trained weights while the average is in the model (``swapped_in``)

    def decay_at(self, update: int) -> float:
        """d_t of optimizer step ``update`` (1-based)."""
        return min(self.decay, (1 + update) / (10 + update)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self) -> None:
        """After an optimizer step: move the average toward the parameters."""
        if self._swapped is not None:
            raise RuntimeError("WeightEMA.update while the average is swapped into the model")
        self.updates += 1
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - self.decay_at(self.updates))

    @torch.no_grad()
    def swap_in(self) -> None:
        """The average into the model's parameters, the trained weights set aside (once: again is a no-op)."""
        if self._swapped is None:
            self._swapped = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.data for p in self.params], self.average)

    @torch.no_grad()
    def swap_out(self) -> None:
        """The trained weights back into the model (a no-op when the average is not in it)."""
        if self._swapped is not None:
            torch._foreach_copy_([p.data for p in self.params], self._swapped)
            self._swapped = None

    @contextmanager
    def swapped_in(self):
        """The average in the model's parameters for the duration, the trained weights back after."""
        self.swap_in()
        try:
            yield
        finally:
            self.swap_out()

    def trained_weights(self) -> dict[str, Tensor]:
        """name -> the trained weights (the model's own, or the ones set aside while the average is swapped in);
        a tied parameter under each of its names."""
        values = self._swapped if self._swapped is not None else [p.detach() for p in self.params]
        return {name: value for names, value in zip(self.aliases, values) for name in names}

    def averaged_weights(self) -> dict[str, Tensor]:
        """name -> the average; a tied parameter under each of its names (a state_dict lists each)."""
        return {name: value for names, value in zip(self.aliases, self.average) for name in names}

    def record(self) -> dict:
        return {"decay": self.decay, "warmup": self.warmup, "updates": self.updates}

    def to_checkpoint(self, checkpoint: dict) -> None:
        """``checkpoint["state_dict"]`` (the LightningModule's) becomes the decoding weights: the average where this
        one has them; the trained weights go to ``raw_state_dict``, whole, for resume."""
        state = checkpoint["state_dict"]
        raw = dict(state)
        raw.update({name: value for name, value in self.trained_weights().items() if name in raw})
        state.update({name: value for name, value in self.averaged_weights().items() if name in state})
        checkpoint[CKPT_RAW_WEIGHTS] = raw
        checkpoint[CKPT_EMA] = self.record()

    def restore(self, average: dict[str, Tensor], updates: int, source: str) -> None:
        """Continue the average a checkpoint holds (``take_average``'s), on this one's device."""
        missing = [name for name in self.names if name not in average]
        if missing:
            raise ValueError(f"{source}: the checkpoint's moving average lacks {missing[:3]}")
        with torch.no_grad():
            for target, name in zip(self.average, self.names):
                target.copy_(average[name])
        self.updates = updates


def take_average(checkpoint: dict, source: str) -> tuple[dict[str, Tensor], int]:
    """Before Lightning loads ``checkpoint["state_dict"]`` into the model to resume an EMA run: put the trained
    weights where Lightning reads them and return (the average, its updates) for ``WeightEMA.restore``."""
    if CKPT_RAW_WEIGHTS not in checkpoint or not isinstance(checkpoint.get(CKPT_EMA), dict):
        raise ValueError(f"{source}: train.ema_decay is set but the checkpoint holds no moving average "
                         f"({CKPT_RAW_WEIGHTS!r}, {CKPT_EMA!r}): it was not written by a run with train.ema_decay")
    average = checkpoint["state_dict"]
    checkpoint["state_dict"] = checkpoint[CKPT_RAW_WEIGHTS]
    return average, int(checkpoint[CKPT_EMA].get("updates", 0))


def take_trained(checkpoint: dict) -> bool:
    """Before Lightning loads ``checkpoint["state_dict"]`` into the model to resume a run *without* a moving average
    (an EMA run's checkpoint resumed by path, ``ckpt_path=FILE``, or with ``force_resume=true``): where the
    checkpoint is an EMA run's, its state_dict holds the average, and its optimizer state belongs to the trained
    weights (``raw_state_dict``): put those where Lightning reads them. Returns whether it did (the average is
    dropped: this run keeps none)."""
    raw = checkpoint.get(CKPT_RAW_WEIGHTS)
    if not isinstance(raw, dict):
        return False
    checkpoint["state_dict"] = raw
    return True
