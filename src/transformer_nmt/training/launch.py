"""What the launcher tells a run: which directory it lives in, which checkpoint it resumes from, and how
SLURM requeues it.

Every process of a job (torchrun or SLURM ranks, a requeued SLURM job) must agree on one run directory,
so its name comes from the job's identity, not from each process's clock (``run_name``, the
``${run_name:...}`` resolver of ``hydra.run.dir``): an explicit ``run_id=``, else ``slurm-$SLURM_JOB_ID``,
else ``torchrun-$TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv_id``), else, for a single process only, the
launch time. ``torchrun --standalone`` draws a new random id at every launch: there the name is
``torchrun-standalone-`` and a hash of the run's fingerprint (``fingerprint.fingerprint_digest``: the settings
that define the run), so that the command run again finds its run dir and resumes, also with another
``trainer.max_time``, ``trainer.devices`` or ``force_resume=true`` (other settings, another dir). A sweep's
directory is named by ``sweep_id=``, else the launch time (``sweep_name``). ``ckpt_path=auto`` then resumes from
the newest checkpoint in that directory, if any (``resume_checkpoint``), which is what a restarted or requeued job needs (``SlurmRequeue``).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Checkpoint

from transformer_nmt import run_files
from transformer_nmt.checkpoint import checkpoint_step
from transformer_nmt.training.fingerprint import fingerprint_digest

log = logging.getLogger(__name__)

TIME_FORMAT = "%Y-%m-%d_%H-%M-%S"


class LaunchError(ValueError):
    """A launch that cannot work as configured; the message says what to pass."""


def standalone(torchrun_id: str) -> bool:
    """Whether a torchrun run id is the random UUID that ``torchrun --standalone`` draws at every launch."""
    try:
        return str(uuid.UUID(torchrun_id)) == torchrun_id
    except ValueError:
        return False


def job_identity(run_id: str | None = None, environ=os.environ, config=None) -> str | None:
    """The name every process and every requeue of one job share, or None outside a launcher.
    ``config``: the composed config, whose fingerprint names a ``torchrun --standalone`` run."""
    if run_id not in (None, ""):
        return str(run_id)
    if environ.get("SLURM_JOB_ID"):  # kept by scontrol requeue
        return f"slurm-{environ['SLURM_JOB_ID']}"
    torchrun = environ.get("TORCHELASTIC_RUN_ID", "none")  # torchrun --rdzv_id (static rendezvous: "none")
    if torchrun != "none" and standalone(torchrun):
        if config is None:
            raise ValueError("job_identity under torchrun --standalone needs the config: its fingerprint names the run")
        return f"torchrun-standalone-{fingerprint_digest(config)}"
    if torchrun != "none":
        return f"torchrun-{torchrun}"
    return None


def run_name(run_id: str | None = None, *, _root_=None) -> str:
    """The last component of ``hydra.run.dir``: the job identity, or the launch time for one process.
    ``_root_``: the composed config (OmegaConf passes it to the resolver)."""
    name = job_identity(run_id, config=_root_)
    if name is not None:
        return name
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        raise SystemExit(  # not an exception: Hydra resolves this before the app runs, and mangles tracebacks
            f"error: WORLD_SIZE={world_size} but no job identity: each process would pick its own time-stamped run "
            f"directory. Pass run_id=NAME (the same on every node), or torchrun --rdzv_id=NAME, or "
            f"hydra.run.dir=DIR; relaunching with the same one resumes the run (ckpt_path=auto)")
    return launch_time()


@functools.cache
def launch_time() -> str:
    """This process's first call's time: ``hydra.run.dir``, resolved several times, names one directory."""
    return time.strftime(TIME_FORMAT)


def sweep_name(sweep_id: str | None = None) -> str:
    """The last component of ``hydra.sweep.dir``: ``sweep_id``, or the launch time. The same command with the same
    ``sweep_id`` runs the sweep again: runs that finished are skipped, the others resume (``finished_already``)."""
    return str(sweep_id) if sweep_id not in (None, "") else time.strftime(TIME_FORMAT)


def resume_checkpoint(ckpt_path: str | None, run_dir: Path) -> tuple[Path | None, str]:
    """(checkpoint to resume from or None, one line for the start-up summary).

    ``auto``: the newest (by step) of ``checkpoints/last.ckpt`` and Lightning's ``hpc_ckpt_*.ckpt`` in the
    run dir, else a fresh start; ``last``: the same, but a missing one is an error; ``null``: fresh; else
    a path.
    """
    if ckpt_path is None:
        return None, "fresh start (ckpt_path=null)"
    if ckpt_path not in ("auto", "last"):
        path = Path(ckpt_path)
        if not path.is_file():
            raise LaunchError(f"ckpt_path={ckpt_path}: no such file (ckpt_path=auto resumes this run dir's last "
                              f"checkpoint when it has one)")
        return path, f"from {path}, step {checkpoint_step(path)} (ckpt_path={ckpt_path})"
    candidates = [p for p in [run_files.last_checkpoint(run_dir), *run_dir.glob(run_files.HPC_PATTERN)] if p.is_file()]
    if not candidates:
        if ckpt_path == "last":
            raise LaunchError(f"ckpt_path=last: no {run_files.CHECKPOINTS}/{run_files.LAST} in {run_dir}; pass the run's directory "
                              f"(run_id=NAME or hydra.run.dir=DIR) to resume it")
        return None, f"fresh start: no checkpoint in {run_dir} (ckpt_path=auto)"
    steps = {path: checkpoint_step(path) for path in candidates}
    path = max(candidates, key=lambda p: (steps[p], p.stat().st_mtime))
    return path, f"from {path}, step {steps[path]} (ckpt_path={ckpt_path})"


def slurm_job(environ=os.environ) -> str:
    """The id ``scontrol requeue`` takes for this job: ``ARRAYID_TASKID`` for a task of a job array (a sweep
    under hydra-submitit-launcher), else ``$SLURM_JOB_ID``."""
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ["SLURM_JOB_ID"]


class LaggedAgreement:
    """Whether any rank raised its flag, agreed every step without waiting for the other ranks: each step
    starts an asynchronous all-reduce (MAX) of this rank's flag and reads the one started a step earlier,
    long finished by then. Every rank reads the same value at the same step. The flag lives in one tensor on
    the device, filled in place (a kernel argument, no host-to-device copy); on CUDA the result is copied to
    one pinned host buffer behind an event, so reading it waits for the previous step's kernels at most."""

    def __init__(self):
        self._value = None  # the flag on the device, all-reduced in place
        self._host = None  # on CUDA: pinned host memory the result is copied to
        self._pending = None  # (work, event or None)

    def exchange(self, flag: bool, device: torch.device) -> bool:
        """Start agreeing on ``flag``; return what the ranks agreed on at the previous call."""
        previous = self.result()
        if self._value is None or self._value.device != device:
            self._value = torch.zeros(1, device=device)
            self._host = torch.zeros(1, pin_memory=True) if self._value.is_cuda else self._value
        self._value.fill_(float(flag))
        work = torch.distributed.all_reduce(self._value, op=torch.distributed.ReduceOp.MAX, async_op=True)
        event = None
        if self._value.is_cuda:
            work.wait()  # NCCL: orders the current stream after the all-reduce; the host does not wait
            self._host.copy_(self._value, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self._pending = (work, event)
        return previous

    def result(self) -> bool:
        """What the last started agreement gave (False if none), waiting for it if it is still running."""
        if self._pending is None:
            return False
        work, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        else:
            work.wait()
        return bool(self._host.item())


class SlurmRequeue(Checkpoint):
    """Under SLURM: on one of ``requeue_signals``, finish the optimizer step in progress, write
    ``checkpoints/last.ckpt``, ``scontrol requeue`` the job and stop. The requeued job keeps its id (a sweep's
    array task keeps its pickled config), hence its run dir, and resumes from that checkpoint exactly.
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
        trainer.save_checkpoint(path)
        job = slurm_job()
        if trainer.is_global_zero:
            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
            if result.returncode:
                log.error("scontrol requeue %s failed (%s): %s", job, result.returncode, result.stderr.strip())
            else:
                log.info("requeue signal at step %d: wrote %s and requeued SLURM job %s; it resumes from there",
                         trainer.global_step, path, job)
        raise SystemExit(0)
