"""Where this project depends on how Lightning works inside, beyond its documented API: one place, each piece
checked against Lightning's own private answer by tests/test_lightning_adapter.py, whose failure names the
Lightning version that changed it (pyproject.toml pins ``lightning>=2.2``).

``is_logging_step``: Lightning decides privately whether an optimizer step logs
(``trainer._logger_connector.should_update_logs``, from the fit loop's private count of batches that
stepped). The same rule is computed here from public trainer attributes only.
"""

from __future__ import annotations

import lightning.pytorch as pl


def is_logging_step(trainer: pl.Trainer) -> bool:
    """In ``on_before_optimizer_step``: whether Lightning logs this optimizer step's ``self.log`` values:
    every ``trainer.log_every_n_steps``-th optimizer step (counted from 1), and any step once the run is
    stopping (``trainer.should_stop``); never with ``log_every_n_steps=0``."""
    every = trainer.log_every_n_steps
    if not every:
        return False
    # global_step: optimizer steps already taken, so this one is global_step + 1 (Lightning's "+ 1" too).
    return (trainer.global_step + 1) % every == 0 or trainer.should_stop
