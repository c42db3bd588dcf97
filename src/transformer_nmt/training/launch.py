"""What the launcher tells a run: which directory it lives in, which checkpoint it resumes from, that no other
launch shares it, and how SLURM requeues it.

Every process of a job (torchrun or SLURM ranks, a requeued SLURM job) must agree on one run directory,
so its name comes from the job's identity, not from each process's clock (``run_name``, the
``${run_name:...}`` resolver of ``hydra.run.dir``): an explicit ``run_id=``, else ``slurm-$SLURM_JOB_ID``,
else ``torchrun-$TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv_id``), else, for a single process only, the
launch time (also under Lightning's own launcher, ``trainer=ddp`` started as one process: it names the dir
before it starts the others, and hands them the dir). ``torchrun --standalone`` draws a new random id at every
launch: there the name is ``torchrun-standalone-`` and a hash of the run's fingerprint
(``fingerprint.fingerprint_digest``: the settings that define the run), so that the command run again finds its
run dir and resumes, also with another ``trainer.max_time``, or ``trainer.devices`` with the same tokens per step
(other settings, another dir). A sweep's directory is named by ``sweep_id=``, else the launch time
(``sweep_name``). ``ckpt_path=auto`` then resumes from the newest checkpoint in that directory, if any
(``resume_checkpoint``), as global rank 0 found it (``agree_on_resume``), which is what a restarted or requeued
job needs (``SlurmRequeue``). A job that requeued itself leaves a note in the run dir (``run_files.REQUEUED``): its
next launch resumes the newest checkpoint whatever ``ckpt_path`` says (``requeued_resume``), since the requeued job
runs the same command, and ``ckpt_path=null`` or a file would otherwise start it over. One launch at a time holds
the directory (``run_dir_lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import time
import uuid
from pathlib import Path

import torch
from hydra.experimental.callback import Callback
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from transformer_nmt import run_files
from transformer_nmt.checkpoint import checkpoint_step
from transformer_nmt.durable import atomic_write
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
            raise LaunchError(f"ckpt_path=last: no {run_files.CHECKPOINTS}/{run_files.LAST} in {run_dir}; "
                              f"pass the run's directory (run_id=NAME or hydra.run.dir=DIR) to resume it")
        return None, f"fresh start: no checkpoint in {run_dir} (ckpt_path=auto)"
    steps = {path: checkpoint_step(path) for path in candidates}
    path = max(candidates, key=lambda p: (steps[p], p.stat().st_mtime))
    return path, f"from {path}, step {steps[path]} (ckpt_path={ckpt_path})"


def note_requeue(run_dir: Path, job: str, step: int | None) -> None:
    """Record in ``run_dir`` that SLURM job ``job`` requeued itself, after writing ``last.ckpt`` at ``step`` (None:
    outside fit, where the newest checkpoint, if any, is what it saved), for ``requeued_resume`` at its next launch.
    Written atomically: a link planted there is replaced, never written through."""
    text = json.dumps({"slurm_job": job, "step": step, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / run_files.REQUEUED, lambda f: f.write(text.encode() + b"\n"))


def requeued_resume(ckpt_path: str | None, run_dir: Path, environ=os.environ) -> tuple[Path, str] | None:
    """The checkpoint this launch resumes because it is a requeued SLURM job, with its start-up line, else None.

    A job that requeued itself (``note_requeue``: the note names this job, ``slurm_job``) runs the same command
    again: with ``ckpt_path=null`` it would start over, with ``ckpt_path=FILE`` from FILE again, and overwrite what
    the requeue saved. Such a launch resumes the run dir's newest checkpoint (as ``ckpt_path=auto``) instead; None
    when this is not a requeued job, when ``ckpt_path`` is ``auto`` or ``last`` (they resume it already), or when the
    job was requeued before it saved anything (it starts as its command says, as its first launch did). A note
    of another job (a new submission reusing the run dir) is ignored: that launch does what its command says."""
    if ckpt_path in ("auto", "last") or not environ.get("SLURM_JOB_ID"):
        return None
    note_path = run_dir / run_files.REQUEUED
    if not note_path.is_file():
        return None
    try:
        note = json.loads(note_path.read_text(encoding="utf-8"))
        job = note["slurm_job"]
    except (ValueError, KeyError, TypeError) as error:
        log.warning("%s is not a requeue note (%s): ignored; ckpt_path=%s applies", note_path, error, ckpt_path)
        return None
    if job != slurm_job(environ):
        return None
    path, _ = resume_checkpoint("auto", run_dir)
    if path is None:
        return None
    given = "null" if ckpt_path is None else ckpt_path
    return path, (f"from {path}, step {checkpoint_step(path)} ({REQUEUE_MARK} {job}: it resumes what its requeue "
                  f"saved; ckpt_path={given} was for its first launch)")


def is_requeue_resume(line: str) -> bool:
    """Whether ``line`` (the resume line every rank agreed on, ``agree_on_resume``) is ``requeued_resume``'s: the
    run dir's own checkpoint, resumed whatever ``ckpt_path`` says."""
    return f"({REQUEUE_MARK} " in line


def forget_requeue(run_dir: Path, job: str) -> None:
    """Remove ``run_dir``'s requeue note of ``job`` (its ``scontrol requeue`` failed: no requeued job will come, and
    a later launch of the same job must do what its command says)."""
    note = run_dir / run_files.REQUEUED
    try:
        if json.loads(note.read_text(encoding="utf-8")).get("slurm_job") == job:
            note.unlink()
    except (OSError, ValueError, AttributeError):
        pass


REQUEUE_MARK = "requeued SLURM job"  # in requeued_resume's start-up line
RESUME_ENV = "TRANSFORMER_NMT_RESUME"  # rank 0's choice, for the child processes of Lightning's own launcher


def agree_on_resume(choice: tuple[Path | None, str], trainer) -> tuple[Path | None, str]:
    """Global rank 0's ``resume_checkpoint`` choice, on every rank: each rank reads the run dir itself, and on a
    shared file system one may see a newer ``last.ckpt`` than another (a directory listing cached on one node);
    ranks that resumed different files would train from different states. ``trainer``: the run's, not fitted yet.

    - One process: its own choice.
    - Rank 0 of a launcher that starts the other ranks in fit (Lightning's own, ``trainer=ddp`` outside torchrun
      and SLURM): its choice, also written to ``$TRANSFORMER_NMT_RESUME``, which the children inherit.
    - A child of that launcher (Lightning's environment, the variable set): the parent's choice.
    - Ranks started together by torchrun, srun or by hand: they join the process group now (Lightning's own
      set-up in fit then finds it joined) and take rank 0's choice (``broadcast_choice``).
    """
    if trainer.world_size == 1:
        return choice
    strategy = trainer.strategy
    if strategy.launcher is not None:
        os.environ[RESUME_ENV] = json.dumps([None if choice[0] is None else str(choice[0]), choice[1]])
        return choice
    if isinstance(strategy.cluster_environment, LightningEnvironment) and RESUME_ENV in os.environ:
        path, line = json.loads(os.environ[RESUME_ENV])
        return (None if path is None else Path(path)), line
    strategy.setup_environment()
    return broadcast_choice(choice, strategy.broadcast, trainer.global_rank)


def broadcast_choice(choice: tuple[Path | None, str], broadcast, rank: int) -> tuple[Path | None, str]:
    """Rank 0's (path, summary line) through ``broadcast`` (``Strategy.broadcast``: every rank calls it, each
    gets rank 0's object); a rank whose own choice differed says so."""
    path, line = broadcast([None if choice[0] is None else str(choice[0]), choice[1]])
    agreed = (None if path is None else Path(path)), line
    if agreed[0] != choice[0]:
        log.warning("rank %d found %s in the run dir, rank 0 %s: every rank resumes rank 0's choice", rank,
                    choice[0] or "no checkpoint", agreed[0] or "no checkpoint")
    return agreed


# --- one launch per run dir -------------------------------------------------------------------------------------

LOCK = run_files.LOCK  # RUN_DIR/.lock: held (flock) by the launch that runs there, and naming it
_held: set[Path] = set()  # the run dirs this process holds: the app takes the lock again inside main's


class RunDirBusy(LaunchError):
    """Another launch holds the run dir."""


@contextlib.contextmanager
def run_dir_lock(run_dir: Path, wait: bool = False):
    """Hold ``RUN_DIR/.lock`` (an exclusive ``flock``) for the block: two launches in one run dir (the same
    ``run_id``, the same second, one SLURM allocation) would overwrite each other's last.ckpt, config.yaml and
    results.json. Global rank 0 takes it (the other ranks are its run's); a second launch refuses
    (``RunDirBusy``, naming the dir and the holder: pid, host, since when), or with ``wait`` waits for it. The
    lock goes with the holding process, however it ends; the file stays (removing it would race a waiter). The
    lock file is opened without following a symbolic link (``O_NOFOLLOW``), and one that is not a plain file of its
    own (a link planted in the run dir: writing the holder into it would truncate its target) is refused."""
    run_dir = Path(run_dir).resolve()
    if rank_zero_only.rank != 0 or run_dir in _held:  # another rank of the run, or held already by this process
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = _open_lock(run_dir / LOCK)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            if not wait:
                raise RunDirBusy(
                    f"{run_dir} is in use by another launch ({holder}): two launches in one run dir would "
                    f"overwrite each other's checkpoints/last.ckpt, config.yaml and results.json. Wait for it to end "
                    f"(or stop it), give this launch its own directory (run_id=NAME or hydra.run.dir=DIR), or pass "
                    f"wait_for_run_dir=true to wait for it and then resume what it left") from None
            log.info("%s is in use by another launch (%s): waiting for it to end (wait_for_run_dir=true)", run_dir,
                     holder)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        handle.flush()
        _held.add(run_dir)
        try:
            yield
        finally:
            _held.discard(run_dir)
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


def _open_lock(path: Path):
    """``path`` opened for reading and writing, created if absent, never through a symbolic link; a
    ``LaunchError`` where it is a link (symbolic, or a hard link: another name of a file elsewhere) or not a
    plain file."""
    def refuse(what: str) -> LaunchError:
        return LaunchError(f"{path} is {what}: a launch writes its pid there and would change the file it leads to. "
                           f"The lock file is the run's own: remove it ({path}) and launch again")
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as error:
        if path.is_symlink():
            raise refuse(f"a symbolic link (to {os.readlink(path)})") from None
        raise LaunchError(f"cannot open the lock file {path}: {error}") from None
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(descriptor)
        raise refuse("not a plain file" if not stat.S_ISREG(status.st_mode)
                     else f"linked from elsewhere ({status.st_nlink} names: a hard link)")
    return os.fdopen(descriptor, "r+")


def planted_links(run_dir: Path, replaced: bool = True) -> list[str]:
    """What of ``run_dir``'s own entries a launch would write through, each as ``"PATH is WHAT"``: a symbolic link
    where it writes into a directory (run_files.WRITTEN_INTO) or opens a file for writing (WRITTEN_IN_PLACE), and
    a hard link (another name of a file elsewhere) of such a file; with ``replaced``, also a symbolic link where it
    replaces a file atomically (REPLACED: the link would be replaced, not written through, but reading it, as a
    resume or a sweep's skip does, reads what it leads to). What lies under a linked directory is not listed."""
    run_dir = Path(run_dir)
    found, linked_dirs = [], []

    def entries(pattern: str) -> list[Path]:
        if any(pattern.startswith(parent) for parent in linked_dirs):
            return []
        return sorted(run_dir.glob(pattern)) if any(c in pattern for c in "*?[") else [run_dir / pattern]

    for patterns, hard in ((run_files.WRITTEN_INTO, False), (run_files.WRITTEN_IN_PLACE, True),
                           (run_files.REPLACED if replaced else (), False)):
        for pattern in patterns:
            for path in entries(pattern):
                try:
                    status = os.lstat(path)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(status.st_mode):
                    found.append(f"{path} is a symbolic link (to {os.readlink(path)!r})")
                    if patterns is run_files.WRITTEN_INTO:
                        linked_dirs.append(pattern + "/")
                elif hard and stat.S_ISREG(status.st_mode) and status.st_nlink > 1:
                    found.append(f"{path} is a hard link ({status.st_nlink} names of one file)")
    return found


def refuse_planted_links(run_dir: Path, replaced: bool = True) -> None:
    """A ``LaunchError`` naming every link of ``planted_links(run_dir, replaced)``: a launch that wrote there would
    change the files and directories they lead to (a user's last.ckpt, a directory of theirs filled with
    checkpoints or event files, a file appended with the run's log)."""
    found = planted_links(run_dir, replaced)
    if found:
        raise LaunchError(f"the run dir {run_dir} holds links where a launch writes: " + "; ".join(found) +
                          ". The run would write through them into what they lead to. A run dir's entries are the "
                          "run's own: remove the links, or give the launch another directory (run_id=NAME or "
                          "hydra.run.dir=DIR)")


class RunDirLogFile(logging.FileHandler):
    """Hydra's job log, ``RUN_DIR/train.log`` (conf/train.yaml: ``hydra.job_logging.handlers.file``). Hydra opens
    it after it makes the run dir and before it writes ``.hydra/`` or calls the app: there it refuses a run dir
    with planted links (``refuse_planted_links``; ``SystemExit`` naming them), so that nothing of the launch is
    written through one. The file itself is opened without following a symbolic link, and refused if it has other
    names (a hard link).

    conf/train.yaml sets this class on the ``file`` handler of whatever ``hydra/job_logging`` is chosen; where the
    choice has no such handler (``disabled``, ``stdout``, a user's own), the entry holds the class alone, no
    ``filename``: then it guards the run dir (``hydra.runtime.output_dir``) all the same and writes nothing."""

    def __init__(self, filename=None, mode: str = "a", encoding: str | None = None, delay: bool = False,
                 errors: str | None = None):
        run_dir = Path(filename).parent if filename is not None else hydra_run_dir()
        try:
            refuse_planted_links(run_dir)
        except LaunchError as error:
            raise SystemExit(f"error: {error}") from None  # not an Exception: logging.config would hide it
        if filename is None:  # the guard alone: no file, nothing logged
            logging.Handler.__init__(self)
            self.baseFilename, self.mode, self.encoding, self.errors, self.stream = None, mode, encoding, errors, None
            return
        super().__init__(filename, mode, encoding, delay, errors)

    def emit(self, record: logging.LogRecord) -> None:
        if self.baseFilename is not None:
            super().emit(record)

    def _open(self):
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if "a" in self.mode
                                                                             else os.O_TRUNC)
        try:
            descriptor = os.open(self.baseFilename, flags, 0o666)
        except OSError as error:
            raise SystemExit(f"error: cannot open the log file {self.baseFilename} (a symbolic link is not "
                             f"followed): {error}") from None
        if os.fstat(descriptor).st_nlink != 1:
            os.close(descriptor)
            raise SystemExit(f"error: the log file {self.baseFilename} is a hard link (another name of a file "
                             f"elsewhere): remove it and launch again")
        return os.fdopen(descriptor, "a" if "a" in self.mode else "w", encoding=self.encoding, errors=self.errors)


def hydra_run_dir() -> Path:
    """The directory of the Hydra job running now (``hydra.runtime.output_dir``)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


class RunDirGuard(Callback):
    """A Hydra callback (conf/train.yaml: ``hydra.callbacks``) that refuses a run dir with planted links before
    Hydra's run writes anything there, whatever ``hydra/job_logging`` is chosen: ``none`` configures no logging,
    so no ``RunDirLogFile`` is built to refuse it. (Each job of a sweep is refused by ``RunDirLogFile``, the
    app checks again before it writes.)"""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(config)  # as Hydra's run_job does next: ${hydra:...} in the run dir
        try:
            refuse_planted_links(Path(str(config.hydra.run.dir)))
        except LaunchError as error:
            raise SystemExit(f"error: {error}") from None


def _holder(handle) -> str:
    handle.seek(0)
    try:
        holder = json.loads(handle.read() or "{}")
    except ValueError:
        holder = {}
    if not holder.get("pid"):
        return "its pid not written yet"
    return f"pid {holder['pid']} on {holder.get('host', '?')}, since {holder.get('since', '?')}"


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
