"""Sweeps through hydra-submitit-launcher (hydra/launcher=submitit_local on CPU): a sweep runs each job in its own
run dir; a job killed mid-run (SIGKILL) or signalled as submitit signals a SLURM job before its time limit
(SIGUSR2) resumes when the same command with the same sweep_id runs again, and ends with the weights of an
uninterrupted run, while the job that finished is skipped. The interrupted jobs wait at step GATE_STEP for the
test (tests/sweep_gate.py): each is interrupted at a known step, however slow the machine."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_cluster import fake_scontrol
from tiny_corpus import tiny_overrides, write_tiny_corpus

import transformer_nmt
from transformer_nmt.checkpoint import read_checkpoint

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")

TOTAL_STEPS = 14
GATE_STEP = 4  # jobs 1 and 2 wait after this step, once its last.ckpt (every 2 steps) is written
# Three runs of one training configuration: trainer.log_every_n_steps is outside the run fingerprint and leaves the
# weights alone, so job 0 (never interrupted) is the reference the interrupted jobs 1 and 2 must end equal to.
AXIS = "trainer.log_every_n_steps=1,2,3"
LAST = "checkpoints/last.ckpt"


def wait_for(predicate, seconds=240):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The sweep run twice with the same command: the first time job 1 is killed and job 2 signalled mid-run."""
    root = tmp_path_factory.mktemp("sweep")
    corpus = write_tiny_corpus(root / "corpus")
    fake_scontrol(root)
    gate = root / "gate"
    gate.mkdir()
    src = Path(transformer_nmt.__file__).resolve().parents[1]
    tests = Path(__file__).resolve().parent  # sweep_gate, sweep_controller
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(src), str(tests), os.environ.get("PYTHONPATH", "")]),
           "PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}", "SCONTROL_LOG": str(root / "scontrol.log"),
           "SLURM_JOB_ID": "5150"}  # the jobs believe they run under SLURM: SlurmRequeue is armed
    callbacks = ("callbacks.slurm_requeue.requeue_signals=[SIGUSR2]", "+callbacks.gate._target_=sweep_gate.Gate",
                 f"+callbacks.gate.gate_dir='{gate}'", f"+callbacks.gate.step={GATE_STEP}",
                 "+callbacks.gate.jobs=[1,2]")
    command = [sys.executable, "-m", "sweep_controller", "-m", "hydra/launcher=submitit_local",  # the train command
               "hydra.launcher.timeout_min=10", *tiny_overrides(corpus), f"trainer.max_steps={TOTAL_STEPS}",
               "trainer.val_check_interval=5", "checkpoint.every_n_train_steps=2", "name=sweep", "sweep_id=s1",
               *callbacks, AXIS]
    sweep_dir = root / "multirun" / "sweep" / "s1"

    first = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for job, signum in ((1, signal.SIGKILL), (2, signal.SIGUSR2)):  # each held at GATE_STEP until interrupted
        ready = gate / f"{job}.ready"
        wait_for(lambda: ready.exists() and ready.read_text())
        os.kill(int(ready.read_text()), signum)
        (gate / f"{job}.go").touch()  # job 2 goes on with the signal noted; the sweep run again is not held
    first_output = first.communicate(timeout=300)[0]
    stopped = {job: read_checkpoint(sweep_dir / str(job) / LAST)["global_step"] for job in (1, 2)}
    finished = (sweep_dir / "0" / "results.json").stat().st_mtime_ns
    scontrol = (root / "scontrol.log").read_text() if (root / "scontrol.log").exists() else ""

    second = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    return {"dir": sweep_dir, "first": (first.returncode, first_output), "stopped": stopped, "scontrol": scontrol,
            "finished": finished, "second": second}


def logs(sweep_dir: Path, job: int) -> str:
    return "".join(p.read_text() for p in sorted(sweep_dir.glob(".submitit/*/*_0_log.*"))
                   if f"{sweep_dir.resolve()}/{job}" in p.read_text())


def test_the_same_command_completes_the_sweep_and_skips_the_finished_job(sweep):
    code, output = sweep["first"]
    assert code != 0, output[-3000:]  # the killed job failed the first sweep
    assert sweep["second"].returncode == 0, sweep["second"].stdout[-3000:] + sweep["second"].stderr[-3000:]
    sweep_dir = sweep["dir"]
    for job in range(3):
        assert (sweep_dir / str(job) / "results.json").is_file()
        assert read_checkpoint(sweep_dir / str(job) / LAST)["global_step"] == TOTAL_STEPS
    assert (sweep_dir / "0" / "results.json").stat().st_mtime_ns == sweep["finished"]  # not run again
    assert "results.json exists: this run of the sweep finished already, skipped" in logs(sweep_dir, 0)


@pytest.mark.parametrize("job", [1, 2], ids=["SIGKILL", "SIGUSR2"])
def test_an_interrupted_job_resumes_and_ends_with_the_weights_of_the_uninterrupted_one(sweep, job):
    sweep_dir = sweep["dir"]
    stopped = sweep["stopped"][job]
    # SIGKILL at the gate: the last.ckpt written there; USR2: SlurmRequeue finishes the next step and writes it.
    assert stopped == {1: GATE_STEP, 2: GATE_STEP + 1}[job]
    assert (f"resume      from {sweep_dir.resolve()}/{job}/{LAST}, step {stopped} (ckpt_path=auto)"
            in logs(sweep_dir, job))
    reference = read_checkpoint(sweep_dir / "0" / LAST)["state_dict"]
    final = read_checkpoint(sweep_dir / str(job) / LAST)["state_dict"]
    difference = max((final[k].float() - reference[k].float()).abs().max().item() for k in reference)
    assert difference == 0.0, f"job {job} stopped at step {stopped}: max abs weight difference {difference}"


def test_submitits_usr2_writes_last_ckpt_after_the_step_and_requeues_the_job(sweep):
    """The job got USR2 where submitit's handler would requeue it without a Lightning checkpoint: SlurmRequeue
    finished the optimizer step, wrote last.ckpt and requeued the SLURM job itself (once: job 1 was killed)."""
    assert sweep["scontrol"] == "requeue 5150\n"
    assert "requeue signal at step" in logs(sweep["dir"], 2)
