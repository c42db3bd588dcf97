"""training/lightning_adapter.py against Lightning's own private answers, on every optimizer step of short fits
(accumulation, validation mid-epoch, an early stop, resumes from mid-epoch and after-validation checkpoints).
A failure means the installed Lightning decides otherwise: the message names its version. And the quiet start-up:
Lightning's own noise dropped, by its exact text and origin, and nothing else."""

import logging
import warnings

import lightning
import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities._pytree import _tree_flatten

from transformer_nmt.training.lightning_adapter import RANK_ZERO_LOGGER, is_logging_step, quiet_start_up


class Recorder(Callback):
    """Each optimizer step: (global step, ours, Lightning's); at step ``stop_at`` it stops the run first."""

    def __init__(self, stop_at: int | None = None):
        self.steps, self.stop_at = [], stop_at

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == self.stop_at:
            trainer.should_stop = True
        lightnings = trainer._logger_connector.should_update_logs  # the private answer ours must equal
        self.steps.append((trainer.global_step, is_logging_step(trainer), lightnings))


def fit(tmp_path, ckpt_path=None, stop_at=None, **trainer_args):
    recorder = Recorder(stop_at)
    checkpoints = ModelCheckpoint(dirpath=tmp_path, filename="step{step}", auto_insert_metric_name=False,
                                  every_n_train_steps=4, save_top_k=-1)
    args = dict(max_steps=14, log_every_n_steps=3, accumulate_grad_batches=2, limit_train_batches=10,
                val_check_interval=6, limit_val_batches=1, num_sanity_val_steps=0, enable_progress_bar=False,
                enable_model_summary=False, logger=False, default_root_dir=tmp_path, accelerator="cpu")
    trainer = pl.Trainer(**{**args, **trainer_args}, callbacks=[recorder, checkpoints])
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    return recorder.steps


def assert_agrees(steps):
    disagree = [(step, ours, theirs) for step, ours, theirs in steps if ours != theirs]
    assert not disagree, (
        f"Lightning {lightning.__version__} decides its logging steps otherwise than "
        f"lightning_adapter.is_logging_step at (global_step, ours, Lightning's) {disagree}: update the adapter "
        f"to this Lightning's trainer._logger_connector.should_update_logs")


@pytest.mark.parametrize("trainer_args", [{}, {"accumulate_grad_batches": 1, "log_every_n_steps": 1},
                                          {"log_every_n_steps": 0}])
def test_logging_steps_are_lightnings_on_every_step_of_a_fit(tmp_path, trainer_args):
    torch.manual_seed(0)
    steps = fit(tmp_path, **trainer_args)
    assert len(steps) == 14
    assert_agrees(steps)
    every = trainer_args.get("log_every_n_steps", 3)
    expected = [step for step in range(14) if every and (step + 1) % every == 0]
    assert [step for step, ours, _ in steps if ours] == expected


def test_logging_steps_are_lightnings_when_the_run_stops_early(tmp_path):
    steps = fit(tmp_path, stop_at=4)  # step 5 is no multiple of 3: it logs because the run stops
    assert_agrees(steps)
    assert steps[-1][:2] == (4, True)


@pytest.mark.parametrize("resume_step", [4, 8])  # 4: saved mid-epoch (after a train batch); 8: the second epoch
def test_logging_steps_are_lightnings_after_a_resume(tmp_path, resume_step):
    fit(tmp_path / "first")
    steps = fit(tmp_path / "resumed", ckpt_path=tmp_path / "first" / f"step{resume_step}.ckpt")
    assert steps[0][0] == resume_step and len(steps) == 14 - resume_step
    assert_agrees(steps)


def test_logging_steps_are_lightnings_after_resuming_from_a_checkpoint_written_after_validation(tmp_path):
    # Lightning counts batches that stepped after on_validation_end's checkpoint and corrects the count on resume
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "first", filename="val{step}", auto_insert_metric_name=False,
                                  save_top_k=-1, save_on_train_epoch_end=False)
    trainer = pl.Trainer(max_steps=7, log_every_n_steps=3, accumulate_grad_batches=2, limit_train_batches=10,
                         val_check_interval=6, limit_val_batches=1, num_sanity_val_steps=0, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoints],
                         default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(BoringModel())
    saved = sorted((tmp_path / "first").glob("val*.ckpt"))
    assert saved, "no checkpoint written after a validation"
    steps = fit(tmp_path / "resumed", ckpt_path=saved[0])
    assert steps and steps[-1][0] == 13
    assert_agrees(steps)


class Records(logging.Handler):
    """Keeps the messages that reach it."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_quiet_start_up_drops_lightnings_advertisement_and_no_other_message(tmp_path):
    rank_zero, records = logging.getLogger(RANK_ZERO_LOGGER), Records()
    rank_zero.addHandler(records)  # a logger's filters run before its own handlers
    level, rank_zero.level = rank_zero.level, logging.INFO
    installed = list(rank_zero.filters)  # an earlier in-process run may have installed the filter already
    for f in installed:
        rank_zero.removeFilter(f)
    try:
        pl.Trainer(logger=False, default_root_dir=tmp_path, accelerator="cpu", enable_progress_bar=False)
        assert any("litlogger" in m for m in records.messages), records.messages  # what the filter is for
        records.messages.clear()
        quiet_start_up()
        quiet_start_up()  # idempotent: one filter
        pl.Trainer(logger=False, default_root_dir=tmp_path, accelerator="cpu", enable_progress_bar=False)
        assert records.messages and not any("Tip:" in m for m in records.messages), records.messages
        assert any(m.startswith("GPU available") for m in records.messages)  # the truthful lines stay
        assert len([f for f in rank_zero.filters if type(f).__name__ == "DropAdvertisements"]) == 1
    finally:
        rank_zero.removeHandler(records)
        rank_zero.level = level
        for f in list(rank_zero.filters):
            rank_zero.removeFilter(f)
        for f in installed:
            rank_zero.addFilter(f)


def test_the_quiet_start_up_drops_the_leafspec_deprecation_from_lightnings_code_only():
    words = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead."
    lightnings = "lightning.pytorch.utilities._pytree"
    with warnings.catch_warnings(record=True) as caught:  # the filters come back as they were at the end
        warnings.simplefilter("always")
        quiet_start_up()
        _tree_flatten({"loss": torch.tensor(1.0)})  # Lightning builds torch's LeafSpec
        warnings.warn_explicit(words, FutureWarning, "_pytree.py", 21, module=lightnings)
        warnings.warn_explicit(words, FutureWarning, "ours.py", 1, module="transformer_nmt.ours")  # not Lightning
        warnings.warn_explicit("another deprecation", FutureWarning, "_pytree.py", 30, module=lightnings)
        warnings.warn_explicit(words, DeprecationWarning, "_pytree.py", 21, module=lightnings)  # another category
    assert [(str(w.message), w.filename) for w in caught] == [
        (words, "ours.py"), ("another deprecation", "_pytree.py"), (words, "_pytree.py")]
