"""Resumes that refuse to train the wrong thing: ``ckpt_path=auto`` resumes only a checkpoint written with this
command's model, data, train and seed settings (the run fingerprint), and says which keys differ and how to
force it."""

import pytest

from test_train_app import one_thread, tiny_config, write_tiny_corpus  # noqa: F401 (fixture)
from transformer_nmt.checkpoint import read_checkpoint
from transformer_nmt.fingerprint import CKPT_FINGERPRINT, ResumeError, run_fingerprint
from transformer_nmt.train import train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def run(corpus, run_dir, max_steps, *overrides):
    return train(tiny_config(corpus, f"trainer.max_steps={max_steps}", "train.val_bleu_max_sentences=0",
                             *overrides), run_dir)


def test_auto_refuses_the_checkpoint_of_a_run_with_other_settings(corpus, tmp_path):
    """One SLURM allocation, one run dir (slurm-$SLURM_JOB_ID): a second command with another lr and dropout
    must not continue the first run's weights and schedule."""
    run(corpus, tmp_path, 3, "checkpoint.every_n_train_steps=3")
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert read_checkpoint(last)[CKPT_FINGERPRINT] == run_fingerprint(tiny_config(corpus, "train.lr_factor=1"))
    with pytest.raises(ResumeError) as refused:
        run(corpus, tmp_path, 4, "train.lr_factor=2.0", "model.dropout=0.3")
    message = str(refused.value)
    assert f"ckpt_path=auto found {last} (step 3)" in message
    assert "  model.dropout: 0.1 in the checkpoint, 0.3 now\n  train.lr_factor: 1.0 in the checkpoint, 2.0 now\n" \
        in message
    assert "pass model.dropout=0.1 train.lr_factor=1.0" in message and "force_resume=true" in message
    assert "run_id=NAME" in message
    assert read_checkpoint(last)["global_step"] == 3  # nothing was trained

    # What may change between launches does not count: devices, logging, time limits, loader processes.
    resumed = run(corpus, tmp_path, 4, "trainer.log_every_n_steps=2", "trainer.max_time=00:01:00:00",
                  "data.num_workers=0", "train.test_bleu_max_sentences=4", "checkpoint.every_n_train_steps=1")
    assert resumed.global_step == 4
    forced = run(corpus, tmp_path, 5, "train.lr_factor=2.0", "force_resume=true")
    assert forced.global_step == 5 and forced.lightning_module.optim["lr_factor"] == 2.0
    assert read_checkpoint(last)[CKPT_FINGERPRINT]["train.lr_factor"] == 2.0  # from now on, the run is this one


def test_a_mid_epoch_resume_with_another_token_budget_is_refused_even_when_forced(corpus, tmp_path):
    run(corpus, tmp_path, 3, "checkpoint.every_n_train_steps=3")
    with pytest.raises(ValueError, match="stopped in epoch 0 after 3 batches, planned with data.max_tokens=512 .* "
                                         "Resume with data.max_tokens=512"):
        run(corpus, tmp_path, 4, "data.max_tokens=600", "force_resume=true")
