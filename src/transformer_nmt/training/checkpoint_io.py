"""Lightning's checkpoint writer, made atomic (checkpoint.atomic_torch_save) and timed."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from transformer_nmt.checkpoint import atomic_torch_save
from transformer_nmt.training.time_budget import TimeBudget, timed


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but a killed writer never leaves a corrupt file (see module doc).

    Lightning's own writer buffers the whole checkpoint and moves it from the system temp directory,
    which is a copy, not a rename, when that directory is on another file system.

    ``time_budget``: the run's time_budget.TimeBudget, where the time it writes counts as ``checkpointing``
    (None: not timed).
    """

    def __init__(self, time_budget: TimeBudget | None = None):
        super().__init__()
        self.time_budget = time_budget

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        with timed(self.time_budget, "checkpointing"):
            atomic_torch_save(checkpoint, path)
