"""Resumes and continuations that went wrong silently (issue 52): an EMA run's checkpoint resumed by path by a run
without EMA continues the trained weights, not the average; a fine-tune resumes its own checkpoint once its parent
file is gone (the parent as its fingerprint recorded it); a continuation whose kept step or epochs already reach the
run's end is refused before training, naming both numbers."""

import hashlib
import json
import shutil

import pytest
import torch
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import CKPT_FINGERPRINT, CKPT_RAW_WEIGHTS, read_checkpoint
from transformer_nmt.training.app import ConfigError, finished_already, train
from transformer_nmt.training.fingerprint import INIT_DIGEST

QUIET = ("trainer.limit_val_batches=0",)  # no validation: only steps make the checkpoints


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("resume-by-path") / "corpus")


@pytest.fixture(scope="module")
def ema_parent(corpus, tmp_path_factory):
    """An EMA run of 12 optimizer steps: the tiny corpus makes 10 batches an epoch, so one epoch finished."""
    run_dir = tmp_path_factory.mktemp("ema-parent")
    train(tiny_config(corpus, "trainer.max_steps=12", "train.ema_decay=0.9", *QUIET), run_dir)
    return run_dir / "checkpoints" / "last.ckpt"


def last(run_dir) -> dict:
    return read_checkpoint(run_dir / "checkpoints" / "last.ckpt")


def test_an_ema_checkpoint_resumed_by_path_without_ema_continues_the_trained_weights(corpus, ema_parent, tmp_path):
    """Resumed at its own step (max_steps 12: the fit restores, then has nothing left), the child's weights are what
    the resume took: the parent's trained ones (raw_state_dict, which its Adam state belongs to), not its moving
    average; a step further, its checkpoint holds no average (this run keeps none)."""
    parent = read_checkpoint(ema_parent)
    trained, average = parent[CKPT_RAW_WEIGHTS], parent["state_dict"]
    assert sum(not torch.equal(trained[k], average[k]) for k in trained) > 10
    trainer = train(tiny_config(corpus, f"ckpt_path={ema_parent}", "trainer.max_steps=12", *QUIET), tmp_path / "a")
    resumed = trainer.lightning_module.state_dict()
    for key, value in trained.items():
        assert torch.equal(resumed[key], value), key
    train(tiny_config(corpus, f"ckpt_path={ema_parent}", "trainer.max_steps=13", *QUIET), tmp_path / "b")
    child = last(tmp_path / "b")
    assert child["global_step"] == 13 and CKPT_RAW_WEIGHTS not in child


def test_a_continuation_whose_kept_step_reaches_max_steps_is_refused_before_training(corpus, ema_parent, tmp_path):
    for max_steps in (12, 5):
        with pytest.raises(ConfigError, match=rf"init_keep=\['step'\] continues init_from={ema_parent}'s step "
                                              rf"counter at 12, and trainer.max_steps={max_steps} is at or below it: "
                                              r"the run would train nothing"):
            train(tiny_config(corpus, f"init_from={ema_parent}", "init_keep=[step]", f"trainer.max_steps={max_steps}",
                              *QUIET), tmp_path / "child")
        assert not (tmp_path / "child" / "results.json").exists()
        assert not (tmp_path / "child" / "checkpoints").exists()


def test_a_continuation_whose_kept_epochs_reach_max_epochs_is_refused(corpus, ema_parent, tmp_path):
    """The variant through the data position: one finished epoch kept, trainer.max_epochs=1."""
    with pytest.raises(ConfigError, match=rf"init_keep=\['data'\] continues init_from={ema_parent}'s data position "
                                          r"after 1 finished epoch\(s\), and trainer.max_epochs=1 is at or below it"):
        train(tiny_config(corpus, f"init_from={ema_parent}", "init_keep=[data]", "trainer.max_epochs=1",
                          "trainer.max_steps=-1", *QUIET), tmp_path / "child")
    assert not (tmp_path / "child" / "results.json").exists()


def test_a_continuation_that_trains_still_runs(corpus, ema_parent, tmp_path):
    train(tiny_config(corpus, f"init_from={ema_parent}", "init_keep=[step]", "trainer.max_steps=13", *QUIET),
          tmp_path)
    assert last(tmp_path)["global_step"] == 13


@pytest.mark.parametrize("force", [False, True], ids=["auto", "force_resume"])
def test_a_fine_tune_resumes_once_its_parent_is_gone(corpus, ema_parent, tmp_path, force):
    """The parent is a copy that is deleted after the child's first launch (as a parent's recent/ window removes
    its files); the child's relaunch resumes its own checkpoint, records the parent's digest (not "missing"), and a
    sweep run again with its settings still finds it finished."""
    parent = tmp_path / "parent.ckpt"
    shutil.copyfile(ema_parent, parent)
    digest = hashlib.sha256(parent.read_bytes()).hexdigest()
    child = tmp_path / "child"
    train(tiny_config(corpus, f"init_from={parent}", "trainer.max_steps=2", *QUIET), child)
    parent.unlink()
    cfg = tiny_config(corpus, f"init_from={parent}", "trainer.max_steps=4", *QUIET,
                      *(["force_resume=true"] if force else []))
    train(cfg, child)
    resumed = last(child)
    assert resumed["global_step"] == 4
    assert resumed[CKPT_FINGERPRINT][INIT_DIGEST] == digest
    results = json.loads((child / "results.json").read_text())
    assert results["init_from"]["sha256"] == digest and results["fingerprint"][INIT_DIGEST] == digest
    assert finished_already(cfg, child, []) is True  # the sweep's check: same settings, skipped


def test_a_fine_tune_whose_parent_is_gone_and_that_has_nothing_to_resume_is_refused_by_name(corpus, tmp_path):
    missing = tmp_path / "gone.ckpt"
    with pytest.raises(ConfigError, match=rf"init_from={missing} does not exist: give the checkpoint"):
        train(tiny_config(corpus, f"init_from={missing}", "trainer.max_steps=2", *QUIET), tmp_path / "child")


def test_a_finished_runs_config_is_read_as_data_no_interpolation_resolved(corpus, tmp_path, monkeypatch):
    """results.json without a fingerprint: the finished run's config.yaml is read for it. An interpolation there
    (a run writes its config resolved, so a file holding one was not written by a run) is refused, naming the key,
    and the environment variable it names is never read."""
    from omegaconf import OmegaConf

    from transformer_nmt.training.fingerprint import ResumeError, saved_results_fingerprint

    monkeypatch.setenv("SECRET_TOKEN", "s3cret-token-value")
    cfg = OmegaConf.to_container(tiny_config(corpus, "trainer.max_steps=2"), resolve=True)
    cfg["train"]["note"] = "${oc.env:SECRET_TOKEN}"
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    with pytest.raises(ResumeError, match=r"config.yaml: train.note='\$\{oc.env:SECRET_TOKEN\}' is an interpolation") \
            as refused:
        saved_results_fingerprint({"precision": "32-true"}, tmp_path / "config.yaml")
    assert "s3cret" not in str(refused.value)
    del cfg["train"]["note"]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    assert saved_results_fingerprint({"precision": "32-true"}, tmp_path / "config.yaml")["trainer.max_steps"] == 2
