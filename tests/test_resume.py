"""Checkpoints: an interrupted-and-resumed run ends with the weights of an uninterrupted one, and a
writer killed mid-write never leaves a corrupt ``last.ckpt``."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from test_train_app import one_thread, tiny_config, write_tiny_corpus  # noqa: F401 (fixture)
from transformer_nmt.checkpoint import AtomicCheckpointIO, read_checkpoint
from transformer_nmt.train import build_trainer, train

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
    assert not torch.equal(checkpoint["state_dict"]["model.src_embed.weight"],
                           uninterrupted["model.src_embed.weight"])

    # Same command and run dir, plus ckpt_path=last: what a preempted job's restart does.
    resumed = run(corpus, tmp_path, TOTAL_STEPS, f"checkpoint.every_n_train_steps={stop}", "ckpt_path=last")
    assert resumed.global_step == TOTAL_STEPS
    final = weights(resumed)
    difference = max((final[k].float() - uninterrupted[k].float()).abs().max().item() for k in uninterrupted)
    assert difference <= 1e-6, f"resumed at step {stop}: max abs weight difference {difference}"
    scheduler = resumed.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == TOTAL_STEPS  # the lr schedule resumed where it stopped


# --- atomic writes ----------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, torch
    from transformer_nmt.checkpoint import AtomicCheckpointIO
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
