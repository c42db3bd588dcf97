"""A loss or gradient that is not finite stops training with an error naming the optimizer step; NaN never reaches
a checkpoint (last.ckpt, the averaging window, best-k) or results.json, and the last finite checkpoint stays.

The step stays free of host syncs (tests/test_sync_free_step.py): the check reads a device flag only on logging
steps, where values are read anyway, and when a checkpoint is saved."""

import math
from types import SimpleNamespace

import pytest
import torch
from tiny_checkpoint import tiny_tokenizer
from tiny_corpus import tiny_config, write_tiny_corpus

import transformer_nmt.training.module as module_
from transformer_nmt import run_files
from transformer_nmt.checkpoint import read_checkpoint
from transformer_nmt.training.app import train
from transformer_nmt.training.non_finite import NonFiniteError

BAD_STEP = 4  # the optimizer step (counted from 1) whose loss or gradient is made non-finite


class NanGradient(torch.autograd.Function):
    """The identity forward; a NaN gradient backward: a finite loss whose gradient is not."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def poison(monkeypatch, what: str) -> None:
    """Make the training loss of optimizer step BAD_STEP NaN (its value and its gradient), or only its gradient."""
    real, calls = module_.label_smoothed_cross_entropy, []

    def loss(*args, **kwargs):
        loss_sum, nll_sum, n_tokens = real(*args, **kwargs)
        if kwargs.get("overwrite_logits"):  # the training step's (validation passes none)
            calls.append(1)
            if len(calls) == BAD_STEP:
                loss_sum = loss_sum * float("nan") if what == "loss" else NanGradient.apply(loss_sum)
        return loss_sum, nll_sum, n_tokens

    monkeypatch.setattr(module_, "label_smoothed_cross_entropy", loss)


def finite(path) -> bool:
    checkpoint = read_checkpoint(path)
    tensors = list(checkpoint["state_dict"].values())
    for state in checkpoint.get("optimizer_states", []):
        tensors += [t for per_param in state["state"].values() for t in per_param.values()
                    if isinstance(t, torch.Tensor)]
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


@pytest.mark.parametrize("what, logging", [("loss", "every step"), ("gradient", "every step"),
                                           ("loss", "rarely"), ("gradient", "rarely")])
def test_a_non_finite_step_stops_training_and_never_reaches_a_checkpoint(tmp_path, monkeypatch, what, logging):
    """Logging every step: the check on that step stops training before the optimizer applies it. Logging rarely
    (every 100 steps): the optimizer applied it, and the next save (last.ckpt and the window every step) refuses."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=48, n_eval=4)
    run_dir = tmp_path / "run"
    cfg = tiny_config(corpus, "trainer.max_steps=8", "checkpoint.every_n_train_steps=1",
                      "checkpoint.recent.keep=3", "checkpoint.recent.every_n_train_steps=1",
                      "trainer.log_every_n_steps=" + ("1" if logging == "every step" else "100"))
    poison(monkeypatch, what)
    with pytest.raises(NonFiniteError, match=rf"optimizer step {BAD_STEP}\b.*not finite") as error:
        train(cfg, run_dir)
    assert f"{run_files.LAST} (step {BAD_STEP - 1})" in str(error.value)  # the last finite checkpoint, named
    stopped_in = {entry.name for entry in error.traceback}  # before the optimizer step, or at the save after it
    assert ("on_before_optimizer_step" if logging == "every step" else "on_save_checkpoint") in stopped_in
    last = run_dir / run_files.CHECKPOINTS / run_files.LAST
    assert read_checkpoint(last)["global_step"] == BAD_STEP - 1 and finite(last)
    window = sorted((run_dir / run_files.CHECKPOINTS / run_files.RECENT).glob("*.ckpt"))
    assert [read_checkpoint(p)["global_step"] for p in window] == [BAD_STEP - 3, BAD_STEP - 2, BAD_STEP - 1]
    assert all(finite(p) for p in run_dir.rglob("*.ckpt"))
    assert not (run_dir / run_files.RESULTS).exists()


@pytest.mark.parametrize("what", ["loss", "gradient"])
def test_a_non_finite_step_no_logging_step_or_save_read_stops_the_run_at_the_end_of_the_fit(tmp_path, monkeypatch,
                                                                                            what):
    """No checkpoint callback, logging every 100 steps, validate_at_end=true: no logging step or save comes after the
    bad step, so the fit's end reads the flag (on_train_end): NonFiniteError naming the step, and no results.json
    (before: the run returned normally and results.json held val_loss NaN)."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=96, n_eval=4)  # 8 batches: no epoch end, no save
    run_dir = tmp_path / "run"
    cfg = tiny_config(corpus, f"trainer.max_steps={BAD_STEP + 1}", "trainer.log_every_n_steps=100",
                      "callbacks.last_checkpoint=null", "checkpoint.recent.keep=0", "validate_at_end=true",
                      "trainer.limit_val_batches=1")
    poison(monkeypatch, what)
    with pytest.raises(NonFiniteError, match=rf"optimizer step {BAD_STEP}\b.*not finite.*no checkpoint was written"
                       ) as error:
        train(cfg, run_dir)
    assert "on_train_end" in {entry.name for entry in error.traceback}
    assert not (run_dir / run_files.RESULTS).exists()
    assert not list(run_dir.rglob("*.ckpt"))


def test_results_json_never_holds_a_number_that_is_not_finite(tmp_path, monkeypatch):
    """The final validation scoring NaN with finite weights (the validation loss made NaN): refused, naming it,
    before results.json; a perplexity above fp32's range would be null, never Infinity (not JSON)."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=48, n_eval=4)
    run_dir = tmp_path / "run"
    cfg = tiny_config(corpus, "trainer.max_steps=2", "callbacks.last_checkpoint=null", "validate_at_end=true",
                      "trainer.limit_val_batches=1")
    real = module_.label_smoothed_cross_entropy

    def loss(*args, **kwargs):
        loss_sum, nll_sum, n_tokens = real(*args, **kwargs)
        if not kwargs.get("overwrite_logits"):  # a validation's
            loss_sum = loss_sum * float("nan")
        return loss_sum, nll_sum, n_tokens

    monkeypatch.setattr(module_, "label_smoothed_cross_entropy", loss)
    with pytest.raises(NonFiniteError, match=r"val/loss is nan \(not finite\) after optimizer step 2: results.json "
                                             r"is not written"):
        train(cfg, run_dir)
    assert not (run_dir / run_files.RESULTS).exists()


def test_a_checkpoint_of_non_finite_weights_is_refused_whatever_saves_it(tmp_path):
    """The save-time check alone (no flag raised by a training step): weights made NaN by hand."""
    tokenizer = tiny_tokenizer(vocab_size=100)
    module = module_.TranslationModule({"vocab_size": tokenizer.vocab_size, "d_model": 16, "n_heads": 2,
                                        "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32},
                                       tokenizer=tokenizer)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)  # finite: saved
    with torch.no_grad():
        module.model.src_embed.weight[3, 1] = math.inf
    with pytest.raises(NonFiniteError, match=r"weights are not finite \(model.src_embed.weight holds NaN or inf"):
        module.on_save_checkpoint({"state_dict": module.state_dict()})


@pytest.mark.parametrize("scaler", [None, "GradScaler"])
def test_under_a_gradient_scaler_an_inf_gradient_is_its_skipped_overflow_but_a_nan_loss_is_not(scaler):
    """16-mixed: the scaler skips a step whose gradients overflowed (and lowers the scale); only a non-finite loss
    is fatal there. Without a scaler, either is."""
    module = module_.TranslationModule({"vocab_size": 16, "d_model": 16, "n_heads": 2, "n_encoder_layers": 1,
                                        "n_decoder_layers": 1, "d_ff": 32})
    module._trainer = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=scaler), global_step=6, callbacks=[])
    finite_sums = torch.tensor([10.0, 10.0, 5.0, 4.0], dtype=torch.float64)
    module._note_non_finite(finite_sums, torch.tensor(math.inf))  # an overflow
    if scaler is None:
        with pytest.raises(NonFiniteError, match=r"optimizer step 7 is not finite"):
            module.check_finite()
    else:
        module.check_finite()
        module._trainer.global_step = 7
        module._note_non_finite(torch.tensor([10.0, 10.0, math.nan, 4.0], dtype=torch.float64), torch.tensor(1.0))
        with pytest.raises(NonFiniteError, match=r"optimizer step 8 is not finite.*no checkpoint was written"):
            module.check_finite()
