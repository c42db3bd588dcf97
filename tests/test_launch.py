"""The run directory comes from the job's identity, so every rank and every requeue of a job agree on it, and
``ckpt_path=auto`` resumes from that directory's newest checkpoint."""

import uuid

import pytest
import torch
from hydra import compose, initialize_config_dir

from transformer_nmt.checkpoint import CKPT_MODEL_CONFIG, CKPT_TOKENIZER
from transformer_nmt.conf import CONF_DIR
from transformer_nmt.training.config import register_configs
from transformer_nmt.training.resume import is_requeue_resume, requeued_resume, resume_checkpoint
from transformer_nmt.training.run_dir import LaunchError, job_identity, launch_time
from transformer_nmt.training.slurm import forget_requeue, note_requeue

LAUNCHERS = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "WORLD_SIZE")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    """No launcher's variables, and no launch time chosen yet: each test is a fresh process's launch (run_name
    tells a single process by its cached launch time, which an earlier test in this worker may have set)."""
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    launch_time.cache_clear()


def hydra_run_dir(*overrides: str) -> str:
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=["name=x", *overrides], return_hydra_config=True).hydra.run.dir


@pytest.mark.parametrize("environ, run_id, expected", [
    ({}, None, None),
    ({"SLURM_JOB_ID": "123"}, None, "slurm-123"),
    ({"TORCHELASTIC_RUN_ID": "abc"}, None, "torchrun-abc"),
    ({"TORCHELASTIC_RUN_ID": "none"}, None, None),  # torchrun without --rdzv_id
    ({"SLURM_JOB_ID": "123", "TORCHELASTIC_RUN_ID": "abc"}, None, "slurm-123"),  # torchrun inside a SLURM job
    ({"SLURM_JOB_ID": "123"}, "mine", "mine"),
])
def test_job_identity(environ, run_id, expected):
    assert job_identity(run_id, environ) == expected


def test_every_rank_of_a_job_resolves_the_same_run_dir(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("SLURM_JOB_ID", "987")
    assert hydra_run_dir() == "outputs/x/slurm-987"
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "wmt")
    assert hydra_run_dir() == "outputs/x/torchrun-wmt"
    assert hydra_run_dir("run_id=base-1") == "outputs/x/base-1"


def test_torchrun_standalone_run_again_finds_its_run_dir(monkeypatch):
    """torchrun --standalone draws a new random TORCHELASTIC_RUN_ID at every launch: the run dir must not follow
    it, or a relaunch starts fresh in a new directory instead of resuming. The same run finds the same dir, also
    relaunched with what may change (a time limit, devices, force_resume); another run another dir."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    dirs = []
    for launch in range(2):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", str(uuid.uuid4()))
        dirs.append(hydra_run_dir("trainer=ddp", "train.lr_factor=2"))
    assert dirs[0] == dirs[1] and dirs[0].startswith("outputs/x/torchrun-standalone-")
    for relaunch in ("trainer.max_time=00:04:00:00", "trainer.devices=4", "force_resume=true", "ckpt_path=last",
                     "trainer.log_every_n_steps=50", "data.num_workers=4"):
        assert hydra_run_dir("trainer=ddp", "train.lr_factor=2", relaunch) == dirs[0], relaunch
    for other_run in ("train.lr_factor=3", "trainer.accumulate_grad_batches=2", "seed=7"):
        assert hydra_run_dir("trainer=ddp", "train.lr_factor=2", other_run) != dirs[0], other_run
    assert hydra_run_dir("trainer=ddp", "run_id=mine") == "outputs/x/mine"


def test_several_processes_without_a_job_identity_are_told_what_to_pass(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="WORLD_SIZE=2 .* run_id=NAME .* --rdzv_id=NAME.* hydra.run.dir=DIR"):
        hydra_run_dir()
    assert hydra_run_dir("hydra.run.dir=runs/a") == "runs/a"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert hydra_run_dir().startswith("outputs/x/20")  # one process: the launch time


def fake_checkpoint(path, step):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "state_dict": {}, CKPT_MODEL_CONFIG: {}, CKPT_TOKENIZER: b"spm"}, path)
    return path


def test_auto_resumes_from_the_newest_checkpoint_of_the_run_dir_or_starts_fresh(tmp_path):
    path, line = resume_checkpoint("auto", tmp_path)
    assert path is None and line == f"fresh start: no checkpoint in {tmp_path} (ckpt_path=auto)"
    last = fake_checkpoint(tmp_path / "checkpoints" / "last.ckpt", 30)
    assert resume_checkpoint("auto", tmp_path) == (last, f"from {last}, step 30 (ckpt_path=auto)")
    hpc = fake_checkpoint(tmp_path / "hpc_ckpt_1.ckpt", 35)  # Lightning's own SLURM requeue checkpoint
    assert resume_checkpoint("auto", tmp_path)[0] == hpc
    fake_checkpoint(last, 40)
    assert resume_checkpoint("last", tmp_path)[0] == last
    assert resume_checkpoint(None, tmp_path) == (None, "fresh start (ckpt_path=null)")


def test_a_requeued_job_resumes_what_it_saved_whatever_its_ckpt_path(tmp_path, caplog):
    """The requeued job runs its first command again: with ckpt_path=null or a file it would start over. The note
    SlurmRequeue leaves makes that job (and only it) resume the run dir's newest checkpoint."""
    first = fake_checkpoint(tmp_path / "elsewhere" / "init.ckpt", 7)  # what ckpt_path=FILE names
    slurm = {"SLURM_JOB_ID": "4242"}
    note_requeue(tmp_path, "4242", None)  # requeued during data set-up: nothing saved yet
    assert requeued_resume(None, tmp_path, slurm) is None  # starts as its command says, as its first launch did
    last = fake_checkpoint(tmp_path / "checkpoints" / "last.ckpt", 30)
    note_requeue(tmp_path, "4242", 30)
    for ckpt_path, shown in ((None, "null"), (str(first), str(first))):
        assert requeued_resume(ckpt_path, tmp_path, slurm) == (
            last, f"from {last}, step 30 (requeued SLURM job 4242: it resumes what its requeue saved; "
                  f"ckpt_path={shown} was for its first launch)")
    assert requeued_resume("auto", tmp_path, slurm) is None  # auto resumes it anyway
    assert requeued_resume(None, tmp_path, {"SLURM_JOB_ID": "5000"}) is None  # a new job reusing the run dir
    assert requeued_resume(None, tmp_path, {}) is None  # not under SLURM
    array_task = {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "3"}
    note_requeue(tmp_path, "4240_3", 30)  # scontrol's id of an array task
    assert requeued_resume(None, tmp_path, array_task)[0] == last
    assert is_requeue_resume(requeued_resume(None, tmp_path, array_task)[1])
    assert not is_requeue_resume(resume_checkpoint("auto", tmp_path)[1])
    forget_requeue(tmp_path, "other")  # another job's failed requeue: this note stays
    assert requeued_resume(None, tmp_path, array_task)[0] == last
    forget_requeue(tmp_path, "4240_3")  # its scontrol requeue failed: no requeued job will come
    assert requeued_resume(None, tmp_path, array_task) is None and not (tmp_path / "requeued.json").exists()
    (tmp_path / "requeued.json").write_text("{not json")
    assert requeued_resume(None, tmp_path, slurm) is None
    assert "is not a requeue note" in caplog.text


def test_missing_checkpoints_are_errors_that_name_the_fix(tmp_path):
    with pytest.raises(LaunchError, match="ckpt_path=last: no checkpoints/last.ckpt in .*run_id=NAME"):
        resume_checkpoint("last", tmp_path)
    with pytest.raises(LaunchError, match="ckpt_path=/nowhere/x.ckpt: no such file"):
        resume_checkpoint("/nowhere/x.ckpt", tmp_path)
