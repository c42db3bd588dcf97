"""Lightning's checkpoint reader and writer: every write atomic (checkpoint.atomic_torch_save) and timed, every
read ``torch.load(weights_only=True)`` (checkpoint.read_checkpoint).

Lightning loads checkpoints (resume through ``trainer.fit(ckpt_path=...)``, ``trainer.test(ckpt_path=...)``, its
SLURM ``hpc_ckpt_*.ckpt``) through the strategy's CheckpointIO; its own passes ``weights_only=None``, which torch
reads as a full unpickler for files Lightning trusts. Here every one of those reads is the project's own
weights-only read: a file that names any object outside tensors and plain containers is refused with an error
naming it, before anything in it is built.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from lightning.pytorch.plugins.io import TorchCheckpointIO

from transformer_nmt.checkpoint import atomic_torch_save, read_checkpoint
from transformer_nmt.training.time_budget import TimeBudget, timed


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, but a killed writer never leaves a corrupt file (see module doc), and its
    reader, but weights-only.

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

    def load_checkpoint(self, path, map_location: Optional[Callable] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        """``read_checkpoint(path)``: weights only, whatever ``weights_only`` Lightning passes (its default None
        would unpickle anything), in today's layout with the trainer's state (checkpoint.migrate_checkpoint: an
        older layout that its optimizer state cannot follow is refused). ``map_location`` is not used: tensors
        load on the CPU, where Lightning's default leaves them before it moves the restored state to the device."""
        return read_checkpoint(path, training_state=True)
