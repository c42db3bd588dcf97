"""Launches that do not mix: a run dir held by one launch at a time, every rank resuming the checkpoint global rank
0 chose, the run dir named once under Lightning's own launcher, only rank 0 writing .hydra/ under torchrun or srun,
and SLURM's requeue signal taken for the whole run, not only during fit."""

import fcntl
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_cluster import fake_scontrol
from lightning.pytorch.plugins.environments import LightningEnvironment, TorchElasticEnvironment
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt import run_files
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.train import rank_overrides
from transformer_nmt.training import resume
from transformer_nmt.training.app import train
from transformer_nmt.training.resume import RESUME_ENV, agree_on_resume
from transformer_nmt.training.run_dir import launch_time, run_name
from transformer_nmt.training.run_dir_lock import RunDirBusy, run_dir_lock


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


# --- one launch per run dir ---------------------------------------------------------------------------------------


def test_a_second_launch_into_a_held_run_dir_refuses_naming_the_dir_and_the_holder(corpus, tmp_path):
    run_dir = tmp_path / "run"
    with run_dir_lock(run_dir):
        holder = json.loads((run_dir / run_files.LOCK).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunDirBusy) as refused:
            train(tiny_config(corpus), run_dir)
    message = str(refused.value)
    assert f"{run_dir.resolve()} is in use by another launch (pid {os.getpid()} on " in message
    assert "wait_for_run_dir=true" in message and "run_id=NAME" in message
    assert not (run_dir / run_files.CONFIG).exists()  # nothing written
    with run_dir_lock(run_dir):  # released with the holder
        pass


def test_wait_for_run_dir_waits_for_the_holder_to_end(tmp_path):
    (tmp_path / run_files.LOCK).write_text(json.dumps({"pid": 4321, "host": "elsewhere", "since": "then"}))
    other = open(tmp_path / run_files.LOCK)  # another launch's hold: flock conflicts between open files
    fcntl.flock(other, fcntl.LOCK_EX)
    release = threading.Timer(0.5, other.close)
    started = time.monotonic()
    release.start()
    with pytest.raises(RunDirBusy, match=r"in use by another launch \(pid 4321 on elsewhere, since then\)"):
        with run_dir_lock(tmp_path):
            pass
    with run_dir_lock(tmp_path, wait=True):
        assert time.monotonic() - started >= 0.4
        assert json.loads((tmp_path / run_files.LOCK).read_text())["pid"] == os.getpid()
    release.join()


# --- rank 0's resume checkpoint on every rank -------------------------------------------------------------------


class FakeStrategy:
    """What agree_on_resume reads of a DDP strategy; ``broadcast`` hands every rank rank 0's object."""

    def __init__(self, rank0, launcher=None, environment=None):
        self.rank0, self.launcher = rank0, launcher
        self.cluster_environment = environment or TorchElasticEnvironment()
        self.joined = 0

    def setup_environment(self):
        self.joined += 1

    def broadcast(self, obj, src=0):
        assert src == 0 and isinstance(obj, list)
        return json.loads(json.dumps(self.rank0))  # as broadcast_object_list pickles it across


def test_peer_ranks_join_the_process_group_and_resume_rank_0s_choice(tmp_path, caplog):
    """torchrun or srun ranks each read the run dir; rank 1 (a stale listing) found an older file than rank 0."""
    own = (tmp_path / "checkpoints" / "last.ckpt", "from last.ckpt, step 3 (ckpt_path=auto)")
    rank0 = [str(tmp_path / "hpc_ckpt_4.ckpt"), "from hpc_ckpt_4.ckpt, step 4 (ckpt_path=auto)"]
    strategy = FakeStrategy(rank0)
    trainer = SimpleNamespace(world_size=2, global_rank=1, strategy=strategy)
    with caplog.at_level(logging.WARNING, logger=resume.__name__):
        assert agree_on_resume(own, trainer) == (tmp_path / "hpc_ckpt_4.ckpt", rank0[1])
    assert strategy.joined == 1  # joined before the broadcast (Lightning's own set-up then finds it joined)
    assert f"rank 1 found {own[0]} in the run dir, rank 0 {tmp_path / 'hpc_ckpt_4.ckpt'}" in caplog.text
    strategy.rank0 = [None, "fresh start: no checkpoint (ckpt_path=auto)"]  # rank 0 saw none: no rank resumes
    assert agree_on_resume(own, trainer) == (None, "fresh start: no checkpoint (ckpt_path=auto)")
    alone = SimpleNamespace(world_size=1, global_rank=0, strategy=FakeStrategy(rank0))
    assert agree_on_resume(own, alone) == own and alone.strategy.joined == 0


def test_lightnings_launcher_hands_rank_0s_choice_to_the_processes_it_starts(tmp_path, monkeypatch):
    monkeypatch.delenv(RESUME_ENV, raising=False)
    choice = (tmp_path / "last.ckpt", "from last.ckpt, step 2 (ckpt_path=auto)")
    parent = SimpleNamespace(world_size=2, global_rank=0, strategy=FakeStrategy(None, launcher=object()))
    assert agree_on_resume(choice, parent) == choice and parent.strategy.joined == 0
    child = SimpleNamespace(world_size=2, global_rank=1,
                            strategy=FakeStrategy(None, environment=LightningEnvironment()))
    assert agree_on_resume((None, "fresh start"), child) == choice  # the variable it inherits
    assert child.strategy.joined == 0  # no collective: the parent joins only in fit


# --- the run dir's name, and what each rank writes there --------------------------------------------------------


def test_the_run_dir_a_process_chose_alone_stands_when_lightnings_launcher_makes_it_one_of_several(monkeypatch):
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    launch_time.cache_clear()
    monkeypatch.setenv("WORLD_SIZE", "2")  # several processes, no job identity, no name chosen yet: refused
    with pytest.raises(SystemExit, match="WORLD_SIZE=2 but no job identity"):
        run_name(None)
    monkeypatch.delenv("WORLD_SIZE")
    chosen = run_name(None)  # Hydra resolves hydra.run.dir once alone ...
    monkeypatch.setenv("WORLD_SIZE", "2")  # ... then Lightning's launcher sets WORLD_SIZE and resolves it again
    assert run_name(None) == chosen


@pytest.mark.parametrize("environ, expected", [
    ({"RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "job"}, "1"),  # torchrun
    ({"SLURM_NTASKS": "16", "SLURM_PROCID": "9", "SLURM_STEP_ID": "0"}, "9"),  # a task of srun
    ({"RANK": "0", "TORCHELASTIC_RUN_ID": "job"}, None),
    ({"SLURM_NTASKS": "16", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, None),
    ({"SLURM_NTASKS": "16", "SLURM_PROCID": "0"}, None),  # the batch script itself
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, None),  # Lightning's child: its launcher passes its own overrides
])
def test_only_global_rank_0_of_torchrun_or_srun_writes_hydras_files_and_the_run_log(environ, expected):
    assert rank_overrides(environ) == ([] if expected is None else
                                       ["hydra.output_subdir=null", f"hydra.job.name=train_rank_{expected}"])


# --- SLURM's requeue signal outside fit -------------------------------------------------------------------------


def test_a_requeue_signal_during_data_setup_requeues_the_job(corpus, tmp_path, monkeypatch):
    """SIGUSR1 (sbatch --signal=USR1@120) while the data is prepared: the job is requeued (scontrol requeue) and
    the process exits 0; before, the signal's default action killed it, with no requeue and no results.json."""
    fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SCONTROL_LOG", str(tmp_path / "scontrol.log"))
    monkeypatch.setenv("SLURM_JOB_ID", "777")

    def signalled_setup(self, stage=None):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(30)  # the data preparation the signal interrupts

    monkeypatch.setattr(TranslationDataModule, "setup", signalled_setup)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    cfg = tiny_config(corpus)
    child = os.fork()  # the signal's default action would end this process: the run goes on in a copy of it
    if child == 0:
        code = 3
        try:
            train(cfg, tmp_path / "run")
        except SystemExit as stop:
            code = stop.code or 0
        except BaseException:
            code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    assert (tmp_path / "scontrol.log").read_text() == "requeue 777\n"
    note = json.loads((tmp_path / "run" / "requeued.json").read_text())  # the requeued job resumes, if it saved
    assert (note["slurm_job"], note["step"]) == ("777", None)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # this process: untouched


def test_the_sbatch_script_ends_every_task_when_one_dies():
    script = (Path(__file__).resolve().parents[1] / "scripts" / "slurm_wmt14_base.sbatch").read_text()
    launches = [line for line in script.splitlines() if line.startswith("srun ")]
    assert launches and all("--kill-on-bad-exit=1" in line.split("python")[0] for line in launches), launches
