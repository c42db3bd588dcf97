"""Where this project depends on how Lightning works inside, beyond its documented API: one place, each piece
checked against Lightning's own private answer by tests/test_lightning_adapter.py, whose failure names the
Lightning version that changed it (pyproject.toml pins ``lightning>=2.2``).

``is_logging_step``: Lightning decides privately whether an optimizer step logs
(``trainer._logger_connector.should_update_logs``, from the fit loop's private count of batches that
stepped). The same rule is computed here from public trainer attributes only.

``quiet_start_up``: what Lightning prints that is noise here, silenced by its exact text and origin (each message
below), so that a real warning still shows. tests/test_train_app.py's smoke run checks the output is free of them.
"""

from __future__ import annotations

import logging
import warnings

import lightning.pytorch as pl

# Lightning's advertisements ("💡 Tip: For seamless cloud logging ... litlogger", "... cloud uploads ...
# litmodels"), logged at INFO through rank_zero_info at every Trainer: not about the run.
ADVERTISEMENT = "💡 Tip: For seamless cloud"
RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"
# torch deprecates LeafSpec, which Lightning's own utilities/_pytree.py builds: a FutureWarning aimed at
# Lightning's code, which a user of this project can do nothing about.
LEAFSPEC_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
LEAFSPEC_MODULE = r"lightning\.pytorch\.utilities\._pytree"


class DropAdvertisements(logging.Filter):
    """Drops the records of a logger whose message starts with ``ADVERTISEMENT``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ADVERTISEMENT)


def quiet_start_up() -> None:
    """Silence, in this process, Lightning's advertisements and the LeafSpec deprecation raised in Lightning's own
    code (see above); idempotent. The other noise has no filter: Lightning's model summary (FLOPs it does not
    count, a bf16 model sized as fp32) is off in conf/trainer/cpu.yaml (the app prints its own summary), and
    the checkpoint writers pass ``weights_only=False`` (full state, for resuming) where Lightning would log that
    it defaulted to it."""
    rank_zero = logging.getLogger(RANK_ZERO_LOGGER)
    if not any(isinstance(f, DropAdvertisements) for f in rank_zero.filters):
        rank_zero.addFilter(DropAdvertisements())
    warnings.filterwarnings("ignore", message=LEAFSPEC_DEPRECATION, category=FutureWarning, module=LEAFSPEC_MODULE)


def is_logging_step(trainer: pl.Trainer) -> bool:
    """In ``on_before_optimizer_step``: whether Lightning logs this optimizer step's ``self.log`` values:
    every ``trainer.log_every_n_steps``-th optimizer step (counted from 1), and any step once the run is
    stopping (``trainer.should_stop``); never with ``log_every_n_steps=0``."""
    every = trainer.log_every_n_steps
    if not every:
        return False
    # global_step: optimizer steps already taken, so this one is global_step + 1 (Lightning's "+ 1" too).
    return (trainer.global_step + 1) % every == 0 or trainer.should_stop
