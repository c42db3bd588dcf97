"""Lightning's checkpoint writer, made atomic (checkpoint.atomic_torch_save) and timed."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from transformer_nmt.checkpoint import atomic_torch_save


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but a killed writer never leaves a corrupt file (see module doc).

    Lightning's own writer buffers the whole checkpoint and moves it from the system temp directory,
    which is a copy, not a rename, when that directory is on another file system.

    The time it writes counts as ``checkpointing`` in the run's time budget (time_budget.TimeBudget sets
    ``time_budget``).
    """

    time_budget = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        with self.time_budget.phase("checkpointing") if self.time_budget else nullcontext():
            atomic_torch_save(checkpoint, path)
