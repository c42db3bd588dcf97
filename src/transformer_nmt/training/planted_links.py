"""The refusal of a run directory holding links where a launch writes (a symbolic link to a user's file or
directory, a hard link of a file written in place): ``refuse_planted_links``, run by the job log's handler
(``RunDirLogFile``) and a Hydra callback (``RunDirGuard``) before Hydra writes anything there, and by the app."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from transformer_nmt import run_files
from transformer_nmt.training.run_dir import LaunchError, hydra_run_dir


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
