"""Test-only (tests/test_sweeps.py): a callback that holds chosen sweep jobs at one optimizer step until the test
releases them, so that the test interrupts each job at a known step, however slow the machine."""

import os
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class Gate(Callback):
    """Sweep job J (its run dir's name) in ``jobs`` stops once optimizer step ``step`` is done, every callback's
    end of that step included (Lightning runs checkpoint callbacks last: last.ckpt is written), writes its pid to
    ``gate_dir/J.ready`` and waits for ``gate_dir/J.go``. A job whose ``J.go`` exists passes: the sweep run again
    is not held."""

    def __init__(self, gate_dir: str, step: int, jobs: list[str]):
        self.gate_dir, self.step, self.jobs = Path(gate_dir), step, [str(job) for job in jobs]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # of the next step
        job = Path(trainer.default_root_dir).name
        go = self.gate_dir / f"{job}.go"
        if trainer.global_step != self.step or job not in self.jobs or go.exists():
            return
        ready = self.gate_dir / f"{job}.ready"
        ready.with_suffix(".tmp").write_text(str(os.getpid()))
        ready.with_suffix(".tmp").rename(ready)  # the test reads the whole pid or no file
        while not go.exists():
            time.sleep(0.01)
