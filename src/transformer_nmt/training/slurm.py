"""SLURM's requeue: on a signal before the time limit or on preemption, finish the optimizer step, save, note the
requeue in the run dir and ``scontrol requeue`` the job (``SlurmRequeue``); the requeued job resumes what it
saved (resume.requeued_resume)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_only

from transformer_nmt import run_files
from transformer_nmt.durable import atomic_write
from transformer_nmt.training.lagged_agreement import LaggedAgreement

log = logging.getLogger(__name__)


def slurm_job(environ=os.environ) -> str:
    """The id ``scontrol requeue`` takes for this job: ``ARRAYID_TASKID`` for a task of a job array (a sweep
    under hydra-submitit-launcher), else ``$SLURM_JOB_ID``."""
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ["SLURM_JOB_ID"]


def note_requeue(run_dir: Path, job: str, step: int | None) -> None:
    """Record in ``run_dir`` that SLURM job ``job`` requeued itself, after writing ``last.ckpt`` at ``step`` (None:
    outside fit, where the newest checkpoint, if any, is what it saved), for ``requeued_resume`` at its next launch.
    Written atomically: a link planted there is replaced, never written through."""
    text = json.dumps({"slurm_job": job, "step": step, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / run_files.REQUEUED, lambda f: f.write(text.encode() + b"\n"))


def forget_requeue(run_dir: Path, job: str) -> None:
    """Remove ``run_dir``'s requeue note of ``job`` (its ``scontrol requeue`` failed: no requeued job will come, and
    a later launch of the same job must do what its command says)."""
    note = run_dir / run_files.REQUEUED
    try:
        if json.loads(note.read_text(encoding="utf-8")).get("slurm_job") == job:
            note.unlink()
    except (OSError, ValueError, AttributeError):
        pass


class SlurmRequeue(Checkpoint):
    """Under SLURM: on one of ``requeue_signals``, finish the optimizer step in progress, write
    ``checkpoints/last.ckpt``, note the requeue in the run dir (``note_requeue``), ``scontrol requeue`` the job and
    stop. The requeued job keeps its id (a sweep's array task keeps its pickled config), hence its run dir, and
    resumes from that checkpoint exactly, whatever its ``ckpt_path`` (``requeued_resume``).
    SIGUSR1 is what ``sbatch --signal=USR1@120`` sends; SIGUSR2 is what hydra-submitit-launcher's jobs get
    (submitit's ``--signal=USR2@signal_delay_s``) before the time limit or on preemption.

    Lightning's own auto-requeue (``SLURMEnvironment(auto_requeue=True)``) writes its checkpoint from inside
    the signal handler, wherever training is, and submitit's requeues without a Lightning checkpoint: the
    resumed run would differ from an uninterrupted one. Installed at ``setup``, over submitit's and before
    Lightning's, this handler only takes note; Lightning then leaves the signal alone, and submitit's is put
    back at ``teardown``. Under DDP the signal may reach one rank only: the ranks agree every optimizer step,
    one step late and without a host sync (``LaggedAgreement``). A ``Checkpoint`` callback, listed after the
    others: it runs after them, so the file holds their state.
    """

    def __init__(self, requeue_signals: tuple[str, ...] | list[str]):  # their default: conf/callbacks/default.yaml
        self.signals = [signal.Signals[name] for name in requeue_signals]
        self.received = False
        self.armed = False  # only under SLURM: elsewhere the callback does nothing, not even a check
        self._step = None
        self._previous: dict = {}
        self._agreement = LaggedAgreement()
        self._run_dir: Path | None = None  # whole_run's

    @contextlib.contextmanager
    def whole_run(self, run_dir: Path):
        """Under SLURM, for the whole app around fit (data set-up, the test after fit): a requeue signal that
        would take its default action (the process dies: no requeue, no results.json) requeues the job at once
        instead (global rank 0 runs ``scontrol requeue``, which stops every task; nothing needs saving outside
        fit: the requeued job resumes from ``run_dir``'s newest checkpoint, ``note_requeue``). During fit
        ``setup`` takes the signal over (finish the step, write last.ckpt). A handler someone else installed
        (submitit's, for USR2) is kept."""
        if not os.environ.get("SLURM_JOB_ID"):
            yield
            return
        self._run_dir = Path(run_dir)
        installed = {s: signal.signal(s, self._requeue_now) for s in self.signals
                     if signal.getsignal(s) == signal.SIG_DFL}
        try:
            yield
        finally:
            for s, previous in installed.items():
                if signal.getsignal(s) == self._requeue_now:
                    signal.signal(s, previous)

    def _requeue_now(self, signum, frame) -> None:
        if rank_zero_only.rank != 0:  # rank 0 got it too (SLURM signals every task) and requeues the job
            log.info("requeue signal %s outside training on rank %d: global rank 0 requeues the job",
                     signal.Signals(signum).name, rank_zero_only.rank)
            return
        job = slurm_job()
        note_requeue(self._run_dir, job, None)  # before the requeue: the requeued job may start at once
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if result.returncode:  # the run goes on: it may yet finish before the time limit
            forget_requeue(self._run_dir, job)
            log.error("requeue signal %s outside training: scontrol requeue %s failed (%s): %s",
                      signal.Signals(signum).name, job, result.returncode, result.stderr.strip())
            return
        log.info("requeue signal %s outside training: requeued SLURM job %s; it resumes from the run dir's newest "
                 "checkpoint", signal.Signals(signum).name, job)
        raise SystemExit(0)

    def setup(self, trainer, pl_module, stage) -> None:
        if stage == "fit" and os.environ.get("SLURM_JOB_ID"):
            self.received = False  # a signal before this fit was submitit's to handle
            self._previous = {s: signal.signal(s, self._note) for s in self.signals}
            self.armed = True

    def teardown(self, trainer, pl_module, stage) -> None:
        self._agreement = LaggedAgreement()  # after an exception, not waited for: another rank may be gone
        for s, previous in self._previous.items():
            if signal.getsignal(s) == self._note:
                signal.signal(s, previous)  # not SIG_DFL: that would kill the process on a late signal
        self._previous, self.armed = {}, False

    def on_train_end(self, trainer, pl_module) -> None:
        self._agreement.result()  # the last step's, started on every rank: none is left running at the teardown

    def _note(self, signum, frame) -> None:
        self.received = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.armed or trainer.global_step == self._step:  # off SLURM, or inside gradient accumulation
            return
        if trainer.world_size > 1:  # any rank got it, one step ago
            stop = self._agreement.exchange(self.received, trainer.strategy.root_device)
        else:
            stop = self.received
        if not stop:
            return
        self._agreement.result()  # this step's agreement, started on every rank: finish it before stopping
        path = run_files.last_checkpoint(trainer.default_root_dir)
        trainer.save_checkpoint(path, weights_only=False)  # the full state, for the requeued job to resume
        job = slurm_job()
        if trainer.is_global_zero:
            note_requeue(Path(trainer.default_root_dir), job, trainer.global_step)  # before the requeue, as above
            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
            if result.returncode:
                forget_requeue(Path(trainer.default_root_dir), job)
                log.error("scontrol requeue %s failed (%s): %s", job, result.returncode, result.stderr.strip())
            else:
                log.info("requeue signal at step %d: wrote %s and requeued SLURM job %s; it resumes from there",
                         trainer.global_step, path, job)
        raise SystemExit(0)
