"""Multi-node training, proven on one machine: torchrun starts 2 "nodes" x 1 process on loopback (gloo, static
rendezvous), ``trainer=multinode``. Node 1's process is killed with SIGKILL mid-run; relaunching both nodes with
the same command completes the run, in one run directory derived from the job (``--rdzv_id``) with one set of
checkpoints, with the weights of an uninterrupted 2-process single-node run to the bit. One equality holds both
claims (2 nodes train as 2 processes on one node; a killed node resumes exactly): an uninterrupted 2-node launch
would add a torchrun per node and prove nothing the killed one does not."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fake_cluster import free_port
from tiny_corpus import tiny_overrides, write_tiny_corpus

import transformer_nmt
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule

STEPS, KILL_STEP = 8, 5  # each rank gets 5 batches an epoch: the runs cross an epoch boundary
JOB = "job"  # torchrun --rdzv_id: the run dir is outputs/mn/torchrun-job

# Test harness for the kill: node 1's process SIGKILLs itself right after optimizer step KILL_STEP, once; every
# process notes the step its fit starts at (a relaunch that trained from scratch would end equal too).
KILLER = textwrap.dedent("""
    import os, signal
    import lightning.pytorch as pl
    from transformer_nmt import train
    from transformer_nmt.training import app

    class KillNode1(pl.Callback):
        def on_train_start(self, trainer, *args):  # where each launch's fit starts, per global rank
            with open(os.environ["START_LOG"], "a") as log:
                log.write(f"{trainer.global_rank} {trainer.global_step}\\n")

        def on_train_batch_end(self, trainer, *args):
            marker = os.environ["KILL_MARKER"]
            if trainer.global_rank == 1 and trainer.global_step == int(os.environ["KILL_STEP"]) \\
                    and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

    build = app.build_callbacks
    app.build_callbacks = lambda *args: build(*args) + [KillNode1()]
    train.main()
""")


def launch(cwd: Path, corpus: Path, nnodes: int, nproc: int, port: int, script: Path | None = None,
           env: dict | None = None) -> list[subprocess.Popen]:
    """One torchrun per node, all with the same command but --node_rank; each writes cwd/node{rank}.log."""
    args = [a for a in tiny_overrides(corpus) if a != "trainer=cpu"] + [
        "trainer=multinode", f"trainer.num_nodes={nnodes}", f"trainer.devices={nproc}", "trainer.accelerator=cpu",
        "trainer.precision=32-true", f"trainer.max_steps={STEPS}", "trainer.val_check_interval=4",
        "checkpoint.every_n_train_steps=2", "checkpoint.recent.keep=2", "checkpoint.recent.every_n_train_steps=2",
        "name=mn"]
    src = Path(transformer_nmt.__file__).resolve().parents[1]
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{src}{os.pathsep}"
           f"{os.environ.get('PYTHONPATH', '')}"}
    cwd.mkdir(parents=True, exist_ok=True)
    nodes = []
    for rank in range(nnodes):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
                   f"--node_rank={rank}", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={JOB}",
                   *(["-m", "transformer_nmt.train"] if script is None else [str(script)]), *args]
        with open(cwd / f"node{rank}.log", "a") as log:
            nodes.append(subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))
    return nodes


def finish(nodes: list[subprocess.Popen], timeout: float = 180) -> list[int]:
    return [node.wait(timeout=timeout) for node in nodes]


def run_dir(cwd: Path) -> Path:
    dirs = list((cwd / "outputs" / "mn").iterdir())
    assert [d.name for d in dirs] == [f"torchrun-{JOB}"], dirs  # every rank (and restart) chose the same one
    return dirs[0]


def final_weights(cwd: Path) -> tuple[int, dict]:
    checkpoint = torch.load(run_dir(cwd) / "checkpoints" / "last.ckpt", weights_only=True)
    return checkpoint["global_step"], checkpoint["state_dict"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    difference = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert difference == 0.0, f"max abs weight difference {difference}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The 2-process single-node run, uninterrupted, and the 2-node run whose node 1 is killed at KILL_STEP, launched
    side by side; then the 2-node run relaunched with the same command. Their working directories, the exit codes
    and last step of the killed launch."""
    tmp = tmp_path_factory.mktemp("multinode")
    corpus = write_tiny_corpus(tmp / "corpus")
    TranslationDataModule(DataConfig(train=f"{corpus}/train", val=f"{corpus}/val", test=f"{corpus}/test",
                                     cache_dir=f"{corpus}/cache", vocab_size=256, max_tokens=512,
                                     num_proc=1)).setup("fit")
    single, killed, marker = tmp / "single", tmp / "killed", tmp / "killed.marker"
    script = tmp / "kill_node1.py"
    script.write_text(KILLER)
    env = {"KILL_STEP": str(KILL_STEP), "KILL_MARKER": str(marker), "START_LOG": str(tmp / "starts.log")}
    port = free_port()
    single_nodes = launch(single, corpus, nnodes=1, nproc=2, port=free_port())
    killed_codes = finish(launch(killed, corpus, nnodes=2, nproc=1, port=port, script=script, env=env))
    codes = finish(single_nodes)
    assert codes == [0], (single / "node0.log").read_text()[-3000:]
    assert marker.exists(), "node 1 was not killed"
    killed_step, _ = final_weights(killed)
    first_starts = (tmp / "starts.log").read_text()
    relaunched = finish(launch(killed, corpus, nnodes=2, nproc=1, port=port, script=script, env=env))  # same command
    starts = (first_starts, (tmp / "starts.log").read_text()[len(first_starts):])  # each launch's
    return {"single": single, "killed": killed, "killed_codes": killed_codes, "killed_step": killed_step,
            "relaunched_codes": relaunched, "starts": starts}


def test_two_nodes_end_with_the_weights_of_two_processes_on_one_node_in_one_run_dir(runs):
    assert runs["relaunched_codes"] == [0, 0], (runs["killed"] / "node0.log").read_text()[-3000:]
    step, multi = final_weights(runs["killed"])
    assert step == STEPS
    assert_same_weights(multi, final_weights(runs["single"])[1])
    run = run_dir(runs["killed"])
    # Only global rank 0 writes .hydra/ and train.log; rank 1 logs to its own file beside it.
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "train_rank_1.log").is_file()
    assert "GLOBAL_RANK: 1" in (run / "train_rank_1.log").read_text()
    assert "GLOBAL_RANK: 1" not in (run / "train.log").read_text()
    checkpoints = run / "checkpoints"
    files = sorted(str(p.relative_to(checkpoints)) for p in checkpoints.rglob("*") if p.is_file())
    # one set, nothing per rank: last, the best of the one validation (step 4), the window of the last 2
    assert files[:3] == ["last.ckpt", "recent/step0000006.ckpt", "recent/step0000008.ckpt"], files
    assert len(files) == 4 and files[3].startswith("step0000004-bleu"), files


def test_a_node_killed_mid_run_and_relaunched_ends_with_the_uninterrupted_weights(runs):
    """Node 1 SIGKILLs itself after step KILL_STEP: node 0 fails with it, and the run's last checkpoint is the one
    before the kill; the same command relaunched resumes it on both nodes and ends with the weights of the
    uninterrupted (single-node) run."""
    codes = runs["killed_codes"]
    assert codes[1] != 0, "node 1 was not killed"
    assert codes[0] != 0, "node 0 finished without its peer"
    assert runs["killed_step"] == 4  # the last checkpoint before the kill (every 2 steps)
    log = (runs["killed"] / "node0.log").read_text()
    assert runs["relaunched_codes"] == [0, 0], log[-3000:]
    assert f"resume      from {run_dir(runs['killed'])}/checkpoints/last.ckpt, step 4 (ckpt_path=auto)" in log
    first, relaunch = (sorted(starts.splitlines()) for starts in runs["starts"])
    assert (first, relaunch) == (["0 0", "1 0"], ["0 4", "1 4"])  # both ranks resumed step 4, not a fresh start
    step, resumed = final_weights(runs["killed"])
    assert step == STEPS
    assert_same_weights(resumed, final_weights(runs["single"])[1])
