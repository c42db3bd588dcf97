"""Resumes that refuse to train the wrong thing: ``ckpt_path=auto`` resumes only a checkpoint written with this
command's model, data, train and seed settings (the run fingerprint), and says which keys differ and how to
force it."""

import copy
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from fake_cluster import fake_scontrol, free_port
from omegaconf import OmegaConf
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import CKPT_FINGERPRINT, read_checkpoint
from transformer_nmt.hardware import CPU_BF16_ENV
from transformer_nmt.training.app import ConfigError, finished_already, train
from transformer_nmt.training.fingerprint import (
    PRECISION,
    PRODUCT,
    RESULTS_FINGERPRINT,
    ResumeError,
    check_same_run,
    differences,
    results_fingerprint,
    run_fingerprint,
)
from transformer_nmt.training.lagged_agreement import LaggedAgreement


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
    assert f"ckpt_path=auto found {last} (step 3), written by a run with other settings" in message
    assert "  model.dropout: 0.1 there, 0.3 now\n  train.lr_factor: 1.0 there, 2.0 now\n" in message
    assert "pass model.dropout=0.1 train.lr_factor=1.0" in message and "force_resume=true" in message
    assert "run_id=NAME" in message
    assert read_checkpoint(last)["global_step"] == 3  # nothing was trained

    # What may change between launches does not count: devices, logging, time limits, loader processes.
    resumed = run(corpus, tmp_path, 4, "trainer.log_every_n_steps=2", "trainer.max_time=00:01:00:00",
                  "data.num_workers=1", "train.test_bleu_max_sentences=4", "checkpoint.every_n_train_steps=1")
    assert resumed.global_step == 4
    forced = run(corpus, tmp_path, 5, "train.lr_factor=2.0", "force_resume=true")
    assert forced.global_step == 5 and forced.lightning_module.optim["lr_factor"] == 2.0
    assert read_checkpoint(last)[CKPT_FINGERPRINT]["train.lr_factor"] == 2.0  # from now on, the run is this one


@pytest.mark.parametrize("override", ["data.cache_dir=elsewhere", "data.val=other/val", "data.test=null",
                                      "train.fused_adam=false", "model.attention=fused",
                                      "model.attention_block_size=64", "trainer.max_time=00:01:00:00",
                                      "trainer.max_steps=99 trainer.log_every_n_steps=7"])
def test_what_may_change_leaves_the_fingerprint_alone(corpus, override):
    assert run_fingerprint(tiny_config(corpus, *override.split())) == run_fingerprint(tiny_config(corpus))


@pytest.mark.parametrize("override, key", [("trainer.accumulate_grad_batches=2", PRODUCT),
                                           ("trainer.devices=2", PRODUCT), ("data.max_tokens=600", PRODUCT),
                                           ("trainer.precision=bf16-mixed", PRECISION),
                                           ("train.clip_grad_norm=1.0", "train.clip_grad_norm"),
                                           ("data.seed=7", "data.seed"), ("model.dropout=0.3", "model.dropout")])
def test_what_changes_training_changes_the_fingerprint(corpus, override, key):
    changed = differences(run_fingerprint(tiny_config(corpus)), run_fingerprint(tiny_config(corpus, override)))
    assert list(changed) == [key]


ACCUMULATION_SCHEDULER = ["+callbacks.accumulate._target_=lightning.pytorch.callbacks.GradientAccumulationScheduler",
                          "+callbacks.accumulate.scheduling={0: 4}"]


@pytest.mark.parametrize("overrides, keys", [
    (["+trainer.limit_train_batches=3"], ["trainer.limit_train_batches"]),
    (["+trainer.overfit_batches=2"], ["trainer.overfit_batches"]),
    (ACCUMULATION_SCHEDULER, ["callbacks.accumulate._target_", "callbacks.accumulate.scheduling.0"]),
    (["callbacks.early_stopping._target_=lightning.pytorch.callbacks.EarlyStopping"],  # a default name, another class
     ["callbacks.early_stopping._target_", "callbacks.early_stopping.monitor", "callbacks.early_stopping.patience",
      "callbacks.early_stopping.val_bleu_max_sentences"]),
])
def test_settings_outside_the_groups_that_change_training_count(corpus, overrides, keys):
    """The fingerprint is the whole config minus what does not train differently, not a list of what does: a
    Lightning trainer option or an added callback (an accumulation scheduler quadruples the tokens per step past
    the tokens_per_step guard) is another run."""
    changed = differences(run_fingerprint(tiny_config(corpus)), run_fingerprint(tiny_config(corpus, *overrides)))
    assert list(changed) == keys


@pytest.mark.parametrize("override", ["callbacks.attention_maps=null", "trainer.val_check_interval=5",
                                      "trainer.limit_val_batches=2", "checkpoint.save_top_k=1", "decode.beam=2",
                                      "run_test=true", "name=other", "wait_for_run_dir=true",
                                      "name=${hydra:job.name}", "+trainer.min_steps=5"])
def test_what_only_observes_or_evaluates_leaves_the_fingerprint_alone(corpus, override):
    assert differences(run_fingerprint(tiny_config(corpus)), run_fingerprint(tiny_config(corpus, override))) == {}


@pytest.mark.parametrize("key", ["model.norm", "model.positions", "train.ema_decay", "data.spm_alpha",
                                 "data.train_upsample"])
def test_a_fingerprint_from_before_an_option_means_its_default(corpus, key):
    """A run dir written before an option existed (its fingerprint lacks the key) resumes under the option's default,
    read from the schema (no list to extend when a field is added), and is another run under any other value."""
    saved = run_fingerprint(tiny_config(corpus))
    del saved[key]
    assert differences(saved, run_fingerprint(tiny_config(corpus))) == {}
    other = {"model.norm": "rmsnorm", "model.positions": "rotary", "train.ema_decay": 0.99, "data.spm_alpha": 0.1,
             "data.train_upsample": [2]}
    changed = differences(saved, run_fingerprint(tiny_config(corpus, f"{key}={other[key]}".replace(" ", ""))))
    assert list(changed) == [key] and changed[key][1] == other[key]


def test_new_pairs_under_the_same_training_path_are_another_run(corpus, tmp_path):
    """data.train names the same files, whose contents changed (pairs appended): refused, since the sampler's
    saved position would index another corpus. (The path counts too: the same bytes under another path differ in
    data.train only.)"""
    copy = tmp_path / "copy"
    copy.mkdir()
    for lang in ("en", "de"):
        (copy / f"train.{lang}").write_bytes((corpus / f"train.{lang}").read_bytes())
    saved = run_fingerprint(tiny_config(corpus))
    moved = tiny_config(corpus, f"data.train={copy}/train")
    before = run_fingerprint(moved)
    assert differences(saved, before) == {"data.train": (f"{corpus}/train", f"{copy}/train")}
    with open(copy / "train.en", "a") as f:
        f.write("one more sentence\n")
    with open(copy / "train.de", "a") as f:
        f.write("ein Satz mehr\n")
    changed = differences(before, run_fingerprint(tiny_config(corpus, f"data.train={copy}/train")))
    assert list(changed) == ["data.train_sha256"]
    with pytest.raises(ResumeError, match=r"data.train_sha256: [0-9a-f]{64} there, [0-9a-f]{64} now") as refused:
        check_same_run(tiny_config(corpus, f"data.train={copy}/train"), before, "found", "Resuming")
    assert "To resume it as it was, restore the training files as it was" not in str(refused.value)
    assert "restore the training files as they were;" in str(refused.value)
    assert "data.train_sha256=" not in str(refused.value)


def test_a_fine_tune_is_fingerprinted_by_its_checkpoints_bytes_and_architecture(corpus, tmp_path):
    """init_from: the checkpoint's sha256, not its path; model.* as that checkpoint's architecture (what trains),
    but the settings the command gives a fine-tune (dropout)."""
    from tiny_checkpoint import tiny_tokenizer, write_checkpoint

    first, copied, other = tmp_path / "a.ckpt", tmp_path / "copied.ckpt", tmp_path / "b.ckpt"
    write_checkpoint(first, tiny_tokenizer(vocab_size=100), d_model=24, n_heads=2)
    copied.write_bytes(first.read_bytes())
    write_checkpoint(other, tiny_tokenizer(vocab_size=100), seed=1, d_model=24, n_heads=2)
    fine_tune = run_fingerprint(tiny_config(corpus, f"init_from={first}", "model.dropout=0.2"))
    assert fine_tune["model.d_model"] == 24 and fine_tune["model.dropout"] == 0.2
    assert fine_tune["init_from.sha256"] == hashlib.sha256(first.read_bytes()).hexdigest()
    same_bytes = run_fingerprint(tiny_config(corpus, f"init_from={copied}", "model.dropout=0.2"))
    assert differences(fine_tune, same_bytes) == {}
    assert list(differences(fine_tune, run_fingerprint(tiny_config(corpus, f"init_from={other}",
                                                                   "model.dropout=0.2")))) == ["init_from.sha256"]
    assert "init_from.sha256" in differences(fine_tune, run_fingerprint(tiny_config(corpus, "model.dropout=0.2")))
    with pytest.raises(ResumeError) as refused:  # the hint names options only: restore the checkpoint
        check_same_run(tiny_config(corpus, f"init_from={other}", "model.dropout=0.2"), fine_tune, "found", "Resuming")
    assert "restore init_from's checkpoint as it was;" in str(refused.value)
    assert "init_from.sha256=" not in str(refused.value)
    # written before format 2, a fine-tune's fingerprint held the command's model.*: compared as it was
    command = run_fingerprint(tiny_config(corpus, "model.dropout=0.2"))
    old = {k: v for k, v in command.items() if k.split(".")[0] in ("model", "data", "train", "seed")
           and k != "data.train_sha256" or k in (PRODUCT, "world_size", PRECISION, "trainer.accumulate_grad_batches")}
    assert differences(old, fine_tune) == {}
    assert list(differences(old, run_fingerprint(tiny_config(corpus, f"init_from={first}", "model.dropout=0.3")))) == [
        "model.dropout"]


def test_a_fingerprint_from_before_the_whole_config_counted_resumes_as_it_was(corpus):
    """Written before format 2: the groups, seed and the resolved keys. Compared on those; the keys it could not
    hold (the training files' digest, trainer options, callbacks) are not held against it."""
    current = run_fingerprint(tiny_config(corpus, *ACCUMULATION_SCHEDULER))
    old = {k: v for k, v in current.items()
           if k.split(".")[0] in ("model", "data", "train", "seed") and k != "data.train_sha256"
           or k in (PRODUCT, "world_size", PRECISION, "trainer.accumulate_grad_batches")}
    assert differences(old, current) == {}
    assert list(differences(old, run_fingerprint(tiny_config(corpus, "model.dropout=0.3")))) == ["model.dropout"]


# --- tokens per step and precision ------------------------------------------------------------------------------


@pytest.mark.parametrize("factors", ["trainer.devices=2 trainer.accumulate_grad_batches=2",
                                     "trainer.accumulate_grad_batches=4", "trainer.devices=2 data.max_tokens=1024",
                                     "trainer.num_nodes=2 trainer.devices=2"])
def test_the_tokens_per_step_may_change_their_factors_but_not_their_product(corpus, factors):
    """A run of 4 processes x accumulation 1 (2,048 tokens per optimizer step) requeued on fewer processes resumes
    when the accumulation makes up for them, and is refused, with the accumulation that would, when not."""
    saved = run_fingerprint(tiny_config(corpus, "trainer.devices=4"))
    assert saved[PRODUCT] == 512 * 4 and saved["world_size"] == 4
    compensated = tiny_config(corpus, *factors.split())
    assert differences(saved, run_fingerprint(compensated)) == {}
    check_same_run(compensated, saved, "found", "Resuming it")  # no error
    with pytest.raises(ResumeError) as refused:
        check_same_run(tiny_config(corpus, "trainer.devices=2"), saved, "found", "Resuming it")
    message = str(refused.value)
    assert ("  tokens_per_step: 2048 there (data.max_tokens 512 x accumulate 1 x 4 processes), 1024 now "
            "(data.max_tokens 512 x accumulate 1 x 2 processes)\n") in message
    assert "pass trainer.accumulate_grad_batches=2;" in message


def test_a_resume_under_another_resolved_precision_is_refused_naming_both(corpus, monkeypatch):
    """trainer.precision=auto on a machine with native bf16 trains in bf16-mixed; requeued onto one without, auto
    gives 32-true: the resume must not switch precision without a word."""
    monkeypatch.setenv(CPU_BF16_ENV, "native")
    saved = run_fingerprint(tiny_config(corpus, "trainer.precision=auto"))
    assert saved[PRECISION] == "bf16-mixed"
    monkeypatch.setenv(CPU_BF16_ENV, "emulated")
    with pytest.raises(ResumeError) as refused:
        check_same_run(tiny_config(corpus, "trainer.precision=auto"), saved, "found", "Resuming it")
    message = str(refused.value)
    assert ("  trainer.precision: bf16-mixed there, 32-true now (trainer.precision=auto: auto: the CPU has "
            "no ") in message
    assert "pass trainer.precision=bf16-mixed;" in message
    check_same_run(tiny_config(corpus, "trainer.precision=bf16-mixed"), saved, "found", "Resuming it")  # no error


def test_a_fingerprint_from_before_tokens_per_step_is_compared_as_it_was(corpus):
    """Checkpoints written before 2026-12 hold data.max_tokens and the accumulation, but neither the world size
    nor the precision: they resume as before (their factors compared), not refused for keys they cannot hold."""
    old = {k: v for k, v in run_fingerprint(tiny_config(corpus)).items() if k not in (PRODUCT, "world_size", PRECISION)}
    assert differences(old, run_fingerprint(tiny_config(corpus, "trainer.devices=2"))) == {}
    assert list(differences(old, run_fingerprint(tiny_config(corpus, "trainer.accumulate_grad_batches=2")))) == [
        "trainer.accumulate_grad_batches"]


def test_clipping_is_set_in_train_not_in_the_trainer(corpus, tmp_path):
    with pytest.raises(ConfigError, match="trainer.gradient_clip_val: .* set train.clip_grad_norm instead"):
        run(corpus, tmp_path, 1, "+trainer.gradient_clip_val=1.0")


def test_a_run_dir_of_the_old_layout_resumes_and_a_finished_one_is_skipped(corpus, tmp_path):
    """Until the structured configs, the data config held ``_target_`` (the datamodule's class; one path before the
    package's layout, another after) and so did the fingerprint in every checkpoint and the run's config.yaml: a
    key that defines nothing, so a resume or a rerun sweep of such a run is accepted as the same run."""
    run(corpus, tmp_path, 2, "checkpoint.every_n_train_steps=2")
    last = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    for target in ("transformer_nmt.datamodule.TranslationDataModule",
                   "transformer_nmt.data.datamodule.TranslationDataModule"):
        checkpoint[CKPT_FINGERPRINT]["data._target_"] = target  # as an older run wrote it
        torch.save(checkpoint, last)
        assert differences(checkpoint[CKPT_FINGERPRINT], run_fingerprint(tiny_config(corpus))) == {}
    assert run(corpus, tmp_path, 3).global_step == 3  # resumed, not refused
    cfg, job = tiny_config(corpus), ["seed=1234"]
    old_config = OmegaConf.to_container(cfg, resolve=True)
    old_config["data"]["_target_"] = "transformer_nmt.datamodule.TranslationDataModule"
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(old_config))
    (tmp_path / "results.json").write_text(json.dumps({"overrides": job}))
    assert finished_already(cfg, tmp_path, job)
    with pytest.raises(ResumeError, match="model.n_heads: 2 there, 4 now"):  # what does define the run still counts
        finished_already(tiny_config(corpus, "model.n_heads=4"), tmp_path, job)


def test_a_mid_epoch_resume_with_another_token_budget_is_refused_even_when_forced(corpus, tmp_path):
    run(corpus, tmp_path, 3, "checkpoint.every_n_train_steps=3")
    with pytest.raises(ValueError, match="stopped in epoch 0 after 3 batches, planned with data.seed=1234 "
                                         "data.max_tokens=512 .* Resume with data.seed=1234 data.max_tokens=512"):
        run(corpus, tmp_path, 4, "data.max_tokens=600", "force_resume=true")


def test_a_sweep_run_again_skips_a_finished_run_only_if_it_ran_with_these_settings(corpus, tmp_path):
    cfg, job = tiny_config(corpus), ["train.lr_factor=1.0", "trainer.log_every_n_steps=1"]
    assert not finished_already(cfg, tmp_path, job)  # no results.json: run (or resume) it
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (tmp_path / "results.json").write_text(json.dumps({"overrides": job}))
    assert finished_already(tiny_config(corpus, "trainer.devices=1", "trainer.log_every_n_steps=3",
                                        "data.num_workers=1"), tmp_path, job)
    (tmp_path / "results.json").write_text('{"overrides": ["train.lr_f')  # a writer killed mid-write (before
    assert not finished_already(cfg, tmp_path, job)  # results.json was atomic): not finished, it runs again
    (tmp_path / "results.json").write_text(json.dumps({"overrides": job}))
    for forced in ((), ("force_resume=true",)):  # a finished run is not resumed: force_resume does not skip it
        with pytest.raises(ResumeError) as refused:
            finished_already(tiny_config(corpus, "model.n_heads=4", *forced), tmp_path, job)
        message = str(refused.value)
        assert (f"the sweep's run in {tmp_path} finished, but it ran with other settings than this command's:\n"
                f"  model.n_heads: 2 there, 4 now\n") in message
        assert f"delete {tmp_path / 'results.json'}" in message and "new sweep_id=NAME" in message
        assert "force_resume" not in message


def test_a_sweep_whose_values_were_reordered_does_not_take_job_n_for_the_old_job_n(corpus, tmp_path):
    """Run dirs are numbered in sweep order: with the axis reordered, job 1 is another run even where the
    fingerprint cannot tell (an axis over a key outside it): finished or not, its directory is refused."""
    old, new = ["trainer.log_every_n_steps=2"], ["trainer.log_every_n_steps=3"]
    train(tiny_config(corpus, "trainer.max_steps=2", "checkpoint.every_n_train_steps=2", *old), tmp_path,
          overrides=old, sweep=True)
    last = tmp_path / "checkpoints" / "last.ckpt"
    (tmp_path / "results.json").rename(tmp_path / "finished.json")  # first as an unfinished job: its checkpoint
    with pytest.raises(ResumeError) as refused:
        train(tiny_config(corpus, "trainer.max_steps=3", *new), tmp_path, overrides=new, sweep=True)
    assert (f"{last} (step 2) ran with the overrides\n  trainer.log_every_n_steps=2\nbut this sweep gives that job "
            f"the overrides\n  trainer.log_every_n_steps=3\n") in str(refused.value)
    assert "new sweep_id=NAME" in str(refused.value) and "force_resume=true" in str(refused.value)
    assert read_checkpoint(last)["global_step"] == 2  # nothing was trained
    (tmp_path / "finished.json").rename(tmp_path / "results.json")  # then as a finished one
    assert finished_already(tiny_config(corpus, "trainer.max_steps=2", *old), tmp_path, old)
    with pytest.raises(ResumeError, match=r"finished; it ran with the overrides\n  trainer.log_every_n_steps=2\n"
                                          r"but .*\n  trainer.log_every_n_steps=3\n.*delete .*results.json"):
        finished_already(tiny_config(corpus, *new), tmp_path, new)


# --- a sweep run again: what shapes the results ----------------------------------------------------------------


def finished(run_dir, cfg, job, fingerprint=True, **results):
    """RUN_DIR as a finished run of ``cfg`` leaves it: config.yaml, results.json (with its results fingerprint,
    or as runs before 2026-12 wrote it)."""
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    record = {"overrides": job, **results, **({RESULTS_FINGERPRINT: results_fingerprint(cfg)} if fingerprint else {})}
    (run_dir / "results.json").write_text(json.dumps(record))


def changed(cfg, overrides: list[str]):
    """A copy of ``cfg`` with dotted KEY=VALUE ``overrides`` (YAML values): composing again for each costs more."""
    cfg = copy.deepcopy(cfg)
    for override in overrides:
        key, value = override.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
    return cfg


@pytest.mark.parametrize("fingerprint", [True, False], ids=["results-fingerprint", "before-2026-12"])
def test_a_finished_run_is_skipped_extended_or_refused_by_what_shapes_its_results(corpus, tmp_path, fingerprint):
    """The issue's case: the experiment file's max_epochs (or max_steps, max_time) edited and the same sweep command
    run again. Skipping would report the shorter run's results as the longer one's: it resumes instead. Any other
    change of what shapes the results (a shorter run, the trainer's validation and batch limits, the evaluation
    sets, the precision) is refused, each key named old -> new."""
    job = ["seed=1234"]
    base = tiny_config(corpus, "trainer.max_steps=40", "trainer.max_epochs=4", "trainer.max_time=00:01:00:00")
    finished(tmp_path, base, job, fingerprint, precision="32-true")
    assert finished_already(base, tmp_path, job)  # the same: skipped
    if not fingerprint:  # a run from before checkpoint.monitor and checkpoint.patience existed: not refused for them
        old = OmegaConf.load(tmp_path / "config.yaml")
        del old.checkpoint["monitor"], old.checkpoint["patience"]
        OmegaConf.save(old, tmp_path / "config.yaml")
        assert finished_already(base, tmp_path, job)
        finished(tmp_path, base, job, fingerprint, precision="32-true")
    for longer in (["trainer.max_epochs=6"], ["trainer.max_steps=-1"], ["trainer.max_time=00:02:00:00"],
                   ["trainer.max_time=null", "trainer.max_steps=80"]):
        assert not finished_already(changed(base, longer), tmp_path, job), longer  # resumed
    for other, line in ((["trainer.max_steps=20"], "trainer.max_steps: 40 there, 20 now"),
                        (["trainer.max_epochs=6", "trainer.max_steps=20"], "trainer.max_steps: 40 there, 20 now"),
                        (["trainer.max_time=00:00:30:00"], "trainer.max_time: 00:01:00:00 there, 00:00:30:00 now"),
                        (["trainer.limit_val_batches=2"], "trainer.limit_val_batches: null there, 2 now"),
                        (["trainer.val_check_interval=5"], "trainer.val_check_interval: null there, 5 now"),
                        (["data.val=other/val"], "data.val: "),
                        (["data.val=[a,b]"], 'data.val: '),  # several validation sets: a list
                        (["checkpoint.patience=2"], "checkpoint.patience: null there, 2 now"),
                        (["train.val_bleu_max_sentences=4"], "train.val_bleu_max_sentences: 8 there, 4 now"),
                        (["trainer.precision=bf16-mixed"], "trainer.precision: 32-true there, bf16-mixed now")):
        with pytest.raises(ResumeError) as refused:
            finished_already(changed(base, other), tmp_path, job)
        assert f"\n  {line}" in str(refused.value), (other, str(refused.value))
        assert "only more steps, epochs or time would resume it" in str(refused.value)
    assert json.loads(json.dumps(results_fingerprint(changed(base, ["data.val=[a,b]"]))))["data.val"] == ["a", "b"]


def test_other_val_or_test_files_under_the_same_paths_are_other_results(corpus, tmp_path):
    """A finished run's results depend on the files it validated and was tested on: their contents are in the results
    fingerprint (not the run's), so a sweep run again after val or test changed under the same path is refused,
    naming the digest; results.json written before the digests existed is compared without them."""
    copy_dir = tmp_path / "sets"
    copy_dir.mkdir()
    for name in ("train", "val", "test"):
        for lang in ("en", "de"):
            (copy_dir / f"{name}.{lang}").write_bytes((corpus / f"{name}.{lang}").read_bytes())
    cfg = tiny_config(corpus, *(f"data.{s}={copy_dir}/{s}" for s in ("train", "val", "test")))
    before = results_fingerprint(cfg)
    assert len(before["data.val_sha256"]) == len(before["data.test_sha256"]) == 64
    assert before["data.val_sha256"] != before["data.test_sha256"]
    assert "data.val_sha256" not in run_fingerprint(cfg)  # a resume is not about them
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    finished(run_dir, cfg, ["seed=1234"], precision="32-true")
    assert finished_already(cfg, run_dir, ["seed=1234"])
    for split in ("val", "test"):
        with open(copy_dir / f"{split}.de", "a") as f:
            f.write("ein Satz mehr\n")
        with open(copy_dir / f"{split}.en", "a") as f:
            f.write("one more sentence\n")
        after = results_fingerprint(cfg)
        assert [k for k in before if before[k] != after[k]] == [f"data.{split}_sha256"]
        with pytest.raises(ResumeError, match=rf"data.{split}_sha256: [0-9a-f]{{64}} there, [0-9a-f]{{64}} now"):
            finished_already(cfg, run_dir, ["seed=1234"])
        before = after
        finished(run_dir, cfg, ["seed=1234"], precision="32-true")
    record = json.loads((run_dir / "results.json").read_text())  # written before the digests existed
    for key in ("data.val_sha256", "data.test_sha256"):
        del record[RESULTS_FINGERPRINT][key]
    (run_dir / "results.json").write_text(json.dumps(record))
    assert finished_already(cfg, run_dir, ["seed=1234"])


def test_a_sweeps_extended_overrides_are_the_same_job(corpus, tmp_path):
    """A longer max_steps on the command line is the same job run longer; other overrides are another job."""
    finished(tmp_path, tiny_config(corpus, "trainer.max_steps=40"), ["trainer.max_steps=40", "seed=1234"])
    assert not finished_already(tiny_config(corpus, "trainer.max_steps=60"), tmp_path,
                                ["trainer.max_steps=60", "seed=1234"])
    with pytest.raises(ResumeError, match="ran with the overrides\n  trainer.max_steps=40 seed=1234\n"):
        finished_already(tiny_config(corpus, "trainer.max_steps=60", "seed=7"), tmp_path,
                         ["trainer.max_steps=60", "seed=7"])


def test_a_finished_sweep_run_extended_resumes_and_ends_with_the_weights_of_the_longer_run(corpus, tmp_path):
    """The same sweep job run again with max_steps 4 -> 8: it is not skipped, resumes from step 4 (where the first
    run stopped mid-epoch) and ends with the weights of an 8-step run; run again once more, it is skipped."""
    common, job = ["train.val_bleu_max_sentences=0"], ["seed=1234"]
    reference = train(tiny_config(corpus, "trainer.max_steps=8", *common), tmp_path / "reference")
    run_dir = tmp_path / "job"
    train(tiny_config(corpus, "trainer.max_steps=4", *common), run_dir, overrides=job, sweep=True)
    longer = tiny_config(corpus, "trainer.max_steps=8", *common)
    assert not finished_already(longer, run_dir, job)
    extended = train(longer, run_dir, overrides=job, sweep=True)
    assert extended.global_step == 8
    a, b = reference.lightning_module.state_dict(), extended.lightning_module.state_dict()
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) == 0.0
    recorded = json.loads((run_dir / "results.json").read_text())[RESULTS_FINGERPRINT]
    assert recorded == results_fingerprint(longer) and recorded["trainer.max_steps"] == 8
    assert finished_already(longer, run_dir, job)


# --- the requeue signal under DDP -------------------------------------------------------------

AGREEMENT = textwrap.dedent("""
    import json, os, signal, sys
    from types import SimpleNamespace
    import torch, torch.distributed as dist
    from transformer_nmt.training.slurm import SlurmRequeue

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    saved = []
    save = lambda path, weights_only: saved.append(trainer.global_step)  # weights_only: said, not defaulted
    trainer = SimpleNamespace(global_step=0, world_size=2, log_every_n_steps=100, is_global_zero=rank == 0,
                              default_root_dir=out, save_checkpoint=save,
                              strategy=SimpleNamespace(root_device=torch.device("cpu")))
    requeue = SlurmRequeue([sys.argv[4]])

    def fit(signal_at):  # one fit: setup, optimizer steps, then on_train_end unless the callback stopped it
        requeue.setup(trainer, None, "fit")
        stopped = None
        for batch_idx in range(12):
            requeue.on_train_batch_start(trainer, None, None, batch_idx)
            trainer.global_step += 1  # the optimizer step
            if rank == 1 and trainer.global_step == signal_at:  # SLURM's warning reaches one rank, mid-interval
                os.kill(os.getpid(), getattr(signal, sys.argv[4]))
            try:
                requeue.on_train_batch_end(trainer, None, None, None, batch_idx)
            except SystemExit:
                stopped = trainer.global_step
                break
        else:
            requeue.on_train_end(trainer, None)  # waits for the last step's agreement, started on both ranks
        left_running = requeue._agreement._pending is not None
        requeue.teardown(trainer, None, "fit")
        return {"stopped": stopped, "saved": list(saved), "left_running": left_running}

    signalled = fit(signal_at=4)
    trainer.global_step, saved[:] = 0, []
    unsignalled = fit(signal_at=None)  # the end of training without a signal: every agreement is finished
    dist.destroy_process_group()  # as Lightning's teardown does
    print(json.dumps([signalled, unsignalled]))
""")


@pytest.mark.parametrize("name", ["SIGUSR2"])
def test_under_ddp_a_signal_on_one_rank_stops_every_rank_at_the_next_step_between_logging_steps(tmp_path, name):
    """log_every_n_steps=100 and a 120-second warning: the ranks must agree at every optimizer step, not only at
    logging steps, or the job is killed before it writes last.ckpt. Two gloo processes; the signal reaches one."""
    fake_scontrol(tmp_path)
    port = free_port()
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "SCONTROL_LOG": str(tmp_path / "scontrol.log"), "SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4240",
           "SLURM_ARRAY_TASK_ID": "3"}
    ranks = [subprocess.Popen([sys.executable, "-c", AGREEMENT, str(rank), str(port), str(tmp_path), name], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    for (out, err), rank in zip(outputs, ranks):
        assert rank.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    signalled, unsignalled = zip(*results)  # per rank
    # Both ranks, the same step: the one after the signal.
    assert list(signalled) == [{"stopped": 5, "saved": [5], "left_running": False}] * 2
    # Without a signal both ranks train to the end, save nothing and leave no all-reduce running at the teardown.
    assert list(unsignalled) == [{"stopped": None, "saved": [], "left_running": False}] * 2
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4240_3\n"  # rank 0 requeues this array task


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_lagged_agreement_never_syncs_the_host_with_the_gpu(tmp_path):
    """Every optimizer step exchanges the flag: no host-to-device copy, no stream sync (a 1-rank NCCL group)."""
    torch.distributed.init_process_group("nccl", rank=0, world_size=1, init_method=f"file://{tmp_path / 'rdzv'}")
    try:
        agreement, device = LaggedAgreement(), torch.device("cuda", 0)
        agreement.exchange(False, device)  # allocates the flag and the pinned buffer once
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            agreed = [agreement.exchange(flag, device) for flag in (False, True, False, False)]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert agreed == [False, False, True, False]  # each step reads the step before's agreement
        assert agreement.result() is False
    finally:
        torch.distributed.destroy_process_group()
