"""Checkpoints: an interrupted-and-resumed run ends with the weights of an uninterrupted one (also when SLURM's
requeue signal interrupts it), a writer killed mid-write never leaves a corrupt ``last.ckpt``, and the
averaging window holds exactly the last K checkpoints."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import lightning.pytorch.callbacks.timer
import pytest
import torch
from fake_cluster import fake_scontrol, free_port
from tiny_corpus import compose_train, tiny_config, tiny_overrides, write_tiny_corpus

import transformer_nmt
import transformer_nmt.checkpoint as checkpoint_module
from transformer_nmt.checkpoint import CKPT_RUN, checkpoint_step, read_checkpoint
from transformer_nmt.inference.average import last_checkpoints
from transformer_nmt.training import app
from transformer_nmt.training.app import build_callbacks, build_trainer, train, with_run_dir
from transformer_nmt.training.checkpoint_io import AtomicCheckpointIO

TOTAL_STEPS = 14  # the tiny corpus makes 10 batches per epoch: the runs cross an epoch boundary


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def run(corpus, run_dir, max_steps, *overrides):
    # dropout 0.1 stays on; validation (with BLEU) runs every 5 batches, between the checkpoints.
    cfg = tiny_config(corpus, f"trainer.max_steps={max_steps}", "trainer.val_check_interval=5", *overrides)
    return train(cfg, run_dir)


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.lightning_module.state_dict().items()}


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    trainer = run(corpus, tmp_path_factory.mktemp("uninterrupted"), TOTAL_STEPS)
    assert trainer.global_step == TOTAL_STEPS
    return weights(trainer)


@pytest.mark.parametrize("stop", [4, 10], ids=["mid-epoch", "epoch-boundary"])
def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(corpus, uninterrupted, tmp_path, stop):
    first = run(corpus, tmp_path, stop, f"checkpoint.every_n_train_steps={stop}")
    assert first.global_step == stop
    last = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint = read_checkpoint(last)  # weights_only=True
    assert checkpoint["global_step"] == stop
    run_identity = checkpoint[CKPT_RUN]
    assert not torch.equal(checkpoint["state_dict"]["model.src_embed.weight"],
                           uninterrupted["model.src_embed.weight"])

    # Same command and run dir, plus ckpt_path=last: what a preempted job's restart does.
    resumed = run(corpus, tmp_path, TOTAL_STEPS, f"checkpoint.every_n_train_steps={stop}", "ckpt_path=last")
    assert resumed.global_step == TOTAL_STEPS
    final = weights(resumed)
    difference = max((final[k].float() - uninterrupted[k].float()).abs().max().item() for k in uninterrupted)
    assert difference == 0.0, f"resumed at step {stop}: max abs weight difference {difference}"  # docs: exactly
    scheduler = resumed.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == TOTAL_STEPS  # the lr schedule resumed where it stopped
    assert read_checkpoint(last)[CKPT_RUN] == run_identity  # one training run, through the resume (averaging)


# --- atomic writes ----------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, torch
    from transformer_nmt.training.checkpoint_io import AtomicCheckpointIO
    big = {"state_dict": {f"w{i}": torch.full((4_000_000,), 2.0) for i in range(16)}, "marker": "new"}  # 256 MB
    print("ready", flush=True)
    AtomicCheckpointIO().save_checkpoint(big, sys.argv[1])
    print("done", flush=True)
""")


def partial_writes(directory):
    found = []
    for path in directory.glob("last.ckpt.tmp-*"):
        try:
            found.append(path.stat().st_size > 0)
        except FileNotFoundError:  # renamed into place meanwhile
            pass
    return any(found)


def test_a_writer_killed_mid_write_leaves_the_previous_last_checkpoint(tmp_path):
    last = tmp_path / "last.ckpt"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    for attempt in range(5):  # the kill must land while the temporary file is being written
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}, "marker": "old"}, last)
        writer = subprocess.Popen([sys.executable, str(script), str(last)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and writer.poll() is None:
            if partial_writes(tmp_path):
                os.kill(writer.pid, signal.SIGKILL)
                break
            time.sleep(0.001)
        writer.wait()
        if writer.returncode == -signal.SIGKILL:
            break
    assert writer.returncode == -signal.SIGKILL, "never caught the writer mid-write"
    assert partial_writes(tmp_path), "the kill did not land during the write"
    survivor = torch.load(last, weights_only=True)  # still a complete, readable checkpoint
    assert survivor["marker"] == "old" and torch.equal(survivor["state_dict"]["w"], torch.ones(3))


def test_the_trainer_writes_checkpoints_atomically(corpus, tmp_path):
    trainer = build_trainer(tiny_config(corpus), tmp_path, callbacks=[])
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


# --- SLURM requeue ----------------------------------------------------------------------------


def test_sigusr1_under_slurm_requeues_and_the_requeued_job_ends_with_the_uninterrupted_weights(
        corpus, uninterrupted, tmp_path):
    """trainer=multinode on one CPU process under a faked SLURM job: SIGUSR1 mid-run writes last.ckpt, calls
    `scontrol requeue JOB` and stops; the same command again (what the requeued job runs) resumes from it, also
    when that command says ckpt_path=null (a fresh start for its first launch only)."""
    fake_scontrol(tmp_path)
    port = free_port()
    src = Path(transformer_nmt.__file__).resolve().parents[1]
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "SCONTROL_LOG": str(tmp_path / "scontrol.log"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_NODELIST": "localhost"}
    command = [sys.executable, "-m", "transformer_nmt.train",
               *[a.replace("trainer=cpu", "trainer=multinode") for a in tiny_overrides(corpus)],
               "trainer.num_nodes=1", "trainer.devices=1", "trainer.accelerator=cpu", "trainer.precision=32-true",
               f"trainer.max_steps={TOTAL_STEPS}", "trainer.val_check_interval=5", "checkpoint.every_n_train_steps=2",
               "name=requeue", "ckpt_path=null"]
    last = tmp_path / "outputs" / "requeue" / "slurm-4242" / "checkpoints" / "last.ckpt"  # from SLURM_JOB_ID
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not last.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    job.send_signal(signal.SIGUSR1)
    output = job.communicate(timeout=240)[0]
    assert job.returncode == 0, output[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n", output[-3000:]
    stopped = read_checkpoint(last)["global_step"]
    assert 2 <= stopped < TOTAL_STEPS

    requeued = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert json.loads((last.parent.parent / "requeued.json").read_text())["slurm_job"] == "4242"
    assert (f"resume      from {last}, step {stopped} (requeued SLURM job 4242: it resumes what its requeue saved; "
            f"ckpt_path=null was for its first launch)") in requeued.stdout + requeued.stderr
    final = read_checkpoint(last)
    assert final["global_step"] == TOTAL_STEPS
    difference = max((final["state_dict"][k].float() - uninterrupted[k].float()).abs().max().item()
                     for k in uninterrupted)
    assert difference == 0.0, f"requeued at step {stopped}: max abs weight difference {difference}"


# --- the averaging window ---------------------------------------------------------------------

def test_the_recent_window_holds_exactly_the_last_k_checkpoints_written_atomically(corpus, tmp_path, monkeypatch):
    renames = []
    replace = checkpoint_module.os.replace
    monkeypatch.setattr(checkpoint_module.os, "replace", lambda a, b: (renames.append((Path(a), Path(b))),
                                                                       replace(a, b))[1])
    run(corpus, tmp_path, 11, "checkpoint.recent.keep=3", "checkpoint.recent.every_n_train_steps=2")
    recent = tmp_path / "checkpoints" / "recent"
    written = [b.name for a, b in renames if b.parent == recent]
    assert written == [f"step{s:07d}.ckpt" for s in (2, 4, 6, 8, 10)]  # every one through a rename ...
    assert all(a.name.startswith(b.name + ".tmp-") for a, b in renames)  # ... of a temporary file beside it
    assert sorted(p.name for p in recent.iterdir()) == [f"step{s:07d}.ckpt" for s in (6, 8, 10)]  # nothing else
    assert [checkpoint_step(p) for p in last_checkpoints(recent, 3)] == [6, 8, 10]


def test_the_papers_recipe_keeps_the_last_5_checkpoints_at_10_minute_intervals(tmp_path):
    cfg = compose_train("experiment=wmt14_base")
    recent = str(tmp_path / "checkpoints" / "recent")
    window = [c for c in build_callbacks(with_run_dir(cfg, tmp_path)) if getattr(c, "dirpath", None) == recent]
    assert len(window) == 1 and window[0].save_top_k == 5
    assert window[0]._train_time_interval == timedelta(minutes=10) and not window[0]._every_n_train_steps


# --- max_time inside gradient accumulation ------------------------------------------------------

class LightningClock:
    """Stands in for the ``time`` module in Lightning's Timer (``max_time``), whose clock it is alone: training
    time passes only when ``jump_at`` says, so the limit falls inside a given micro-batch on any machine."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class JumpAt(pl.Callback):
    """An hour passes during training batch ``batch`` (counted over the whole run, from 0)."""

    def __init__(self, clock: LightningClock, batch: int):
        self.clock, self.batch = clock, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.batch:
            self.clock.now += 3600.0


def test_max_time_inside_gradient_accumulation_stops_on_the_step_and_resumes_exactly(corpus, tmp_path, monkeypatch):
    """accumulate_grad_batches=3 and trainer.max_time reached in micro-batch 4 (the second of optimizer step 2):
    training stops after that step's third micro-batch, last.ckpt holds step 2, and the run resumed from it ends
    with the weights of an uninterrupted one. (Lightning's own Timer stops after micro-batch 4: last.ckpt, at step
    1, counted micro-batches 3 and 4 as trained and the resume skipped them.)"""
    steps = ["trainer.accumulate_grad_batches=3", "trainer.max_steps=5", "train.val_bleu_max_sentences=0"]
    reference = weights(train(tiny_config(corpus, *steps), tmp_path / "uninterrupted"))  # 15 micro-batches, 2 epochs
    clock = LightningClock()
    monkeypatch.setattr(lightning.pytorch.callbacks.timer, "time", clock)
    build = app.build_callbacks
    monkeypatch.setattr(app, "build_callbacks", lambda *args: build(*args) + [JumpAt(clock, batch=4)])
    run_dir = tmp_path / "stopped"
    stopped = train(tiny_config(corpus, *steps, "trainer.max_time=00:00:30:00"), run_dir)
    assert stopped.global_step == 2 and stopped.fit_loop.total_batch_idx == 5  # micro-batches 0-5 trained
    last = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 2
    assert last["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["ready"] == 6
    monkeypatch.setattr(app, "build_callbacks", build)
    resumed = train(tiny_config(corpus, *steps), run_dir)  # the same run, no time limit: ckpt_path=auto
    assert resumed.global_step == 5
    final = weights(resumed)
    difference = max((final[k].float() - reference[k].float()).abs().max().item() for k in reference)
    assert difference == 0.0, f"max abs weight difference {difference}"
