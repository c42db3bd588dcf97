"""Files and directories that survive crashes and neighbours: written under a name no other writer can hold,
flushed to disk, then renamed into place, and the rename itself made durable.

- A temporary name comes from ``tempfile.mkstemp``/``mkdtemp`` in the destination's directory (a rename
  across file systems would be a copy): unique on a file system shared by several hosts, where two writers may
  have the same pid; nothing removes a temporary name it did not create.
- Before the rename every file of what is published is fsynced, and its directories; after it the parent
  directory: after a power loss the new name holds complete contents or does not exist.
- Published files and directories get the permissions the process's umask gives (mkstemp and mkdtemp make
  them private to the owner).
- A directory that replaces another (``replace_directory``) is complete before the old one leaves its name, and
  the old one is removed only once the new one has taken it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def umask() -> int:
    """The process's umask, read without changing it where Linux reports it (os.umask sets it to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_directory(path: str | os.PathLike) -> None:
    """Make the entries of directory ``path`` (a rename into it, a file created in it) durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file under directory ``root``, then every directory, deepest first, ``root`` last."""
    directories = []
    for directory, _, files in os.walk(root):
        directories.append(directory)
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for directory in reversed(directories):
        fsync_directory(directory)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """``write(file)`` into a fresh temporary file next to ``path``, fsync, then rename it over ``path``: a
    process killed meanwhile leaves the previous file, or none, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, tmp = tempfile.mkstemp(prefix=f"{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_directory(path.parent)


def temporary_directory(path: str | os.PathLike) -> Path:
    """A fresh empty directory beside ``path`` (``NAME.tmp-XXXXXXXX``), to build what ``publish_directory``
    renames to ``path``; only its creator writes into it or removes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{path.name}.tmp-", dir=path.parent))
    tmp.chmod(0o777 & ~umask())
    return tmp


def publish_directory(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """fsync everything under ``tmp``, rename it to ``path`` (``os.replace``: fails when ``path`` is a directory
    that is not empty) and make the rename durable."""
    fsync_tree(tmp)
    os.replace(tmp, path)
    fsync_directory(Path(path).parent)


def replace_directory(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Publish directory ``tmp`` at ``path``, where a directory stands already: fsync everything under ``tmp``,
    move the old directory aside (to a fresh ``NAME.old-XXXXXXXX`` beside it), rename ``tmp`` to ``path``, make
    the renames durable, then remove the old one. A failure of the second rename puts the old directory back; a
    process killed between the two renames leaves it, complete, under the ``.old-`` name."""
    path = Path(path)
    fsync_tree(tmp)
    old = Path(tempfile.mkdtemp(prefix=f"{path.name}.old-", dir=path.parent))  # empty: a directory renames over it
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    fsync_directory(path.parent)
    shutil.rmtree(old)


def check_replaceable(output: Path, export: Path) -> None:
    """A SystemExit, with what ``output`` holds named, unless it is a directory of nothing but files of the names
    ``export`` (the new export, complete) holds: what ``force=true`` may replace is an earlier export, never a run
    dir, a checkpoint, a subdirectory or a file of the user's."""
    if output.is_symlink() or not output.is_dir():
        raise SystemExit(f"output={output} is {'a symbolic link' if output.is_symlink() else 'a file'}, not an export "
                         f"directory: force=true replaces an earlier export only; choose another output=DIR")
    names = {path.name for path in export.iterdir()}
    foreign = sorted(path.name + ("/" if path.is_dir() else "") for path in output.iterdir()
                     if path.name not in names or path.is_symlink() or not path.is_file())
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise SystemExit(f"output={output} holds {shown}, which is not what an export holds "
                         f"({', '.join(sorted(names))}): force=true replaces an earlier export only, and nothing was "
                         f"changed; choose another output=DIR, or remove what is there yourself")
