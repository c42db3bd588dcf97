"""One launch at a time in a run directory: ``RUN_DIR/.lock``, an exclusive ``flock`` naming its holder, taken once
per run (``app.train``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only

from transformer_nmt import run_files
from transformer_nmt.training.run_dir import LaunchError

log = logging.getLogger(__name__)

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
    own (a link planted in the run dir: writing the holder into it would truncate its target) is refused. A run
takes it once (``app.train``): the same process taking it again waits for, or is refused by, itself."""
    run_dir = Path(run_dir).resolve()
    if rank_zero_only.rank != 0:  # another rank of the run
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = _open_lock(run_dir / run_files.LOCK)
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
        try:
            yield
        finally:
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


def _holder(handle) -> str:
    handle.seek(0)
    try:
        holder = json.loads(handle.read() or "{}")
    except ValueError:
        holder = {}
    if not holder.get("pid"):
        return "its pid not written yet"
    return f"pid {holder['pid']} on {holder.get('host', '?')}, since {holder.get('since', '?')}"
