"""The run directory: its name, which every process of a job agrees on, and the error of a launch that cannot use it.

Every process of a job (torchrun or SLURM ranks, a requeued SLURM job) must agree on one run directory,
so its name comes from the job's identity, not from each process's clock (``run_name``, the
``${run_name:...}`` resolver of ``hydra.run.dir``): an explicit ``run_id=``, else ``slurm-$SLURM_JOB_ID``,
else ``torchrun-$TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv_id``), else, for a single process only, the
launch time (also under Lightning's own launcher, ``trainer=ddp`` started as one process: it names the dir
before it starts the others, and hands them the dir). ``torchrun --standalone`` draws a new random id at every
launch: there the name is ``torchrun-standalone-`` and a hash of the run's fingerprint
(``fingerprint.fingerprint_digest``: the settings that define the run), so that the command run again finds its
run dir and resumes (resume.py), also with another ``trainer.max_time``, or ``trainer.devices`` with the same
tokens per step (other settings, another dir). A sweep's directory is named by ``sweep_id=``, else the launch time
(``sweep_name``).
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from pathlib import Path

from transformer_nmt.training.fingerprint import fingerprint_digest

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
    # Lightning's own launcher (trainer=ddp outside torchrun and SLURM) sets WORLD_SIZE in this process after it
    # chose its run dir as a single process, then resolves hydra.run.dir again to hand it to its child processes
    # (as hydra.run.dir=DIR, so they never get here): the name this process chose stands.
    if world_size > 1 and not launch_time.cache_info().currsize:
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


def hydra_run_dir() -> Path:
    """The directory of the Hydra job running now (``hydra.runtime.output_dir``)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)
