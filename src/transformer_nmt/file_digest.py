"""The sha256 of a file's bytes, hashed once per version of the file.

Caches keyed by a file's path, size and modification time serve stale entries when the file is replaced by
another one of the same size with its time kept (``cp -p``, ``rsync -a``, an image with normalised times): the
caches of this package are keyed by content instead (``content_digest``). Hashing a checkpoint or a corpus on
every use would read gigabytes, so the digest is memoized under ``memo_dir`` by the file's whole identity: its
resolved path, device, inode, size, modification and status-change times. A file rewritten or replaced has a new
status-change time (the kernel sets it at every write and rename; ``cp -p``, ``rsync -a`` and image layers restore
the modification time, never that one) or a new inode, hence no memo: its bytes are hashed again.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from transformer_nmt.durable import atomic_write

HEX = frozenset("0123456789abcdef")


def _memo(path: Path, stat: os.stat_result, memo_dir: Path) -> Path:
    identity = (f"{path.resolve()}\0{stat.st_dev}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}\0"
                f"{stat.st_ctime_ns}")
    return memo_dir / hashlib.sha256(identity.encode()).hexdigest()[:32]


def content_digest(path: str | os.PathLike, memo_dir: str | os.PathLike) -> str:
    """The sha256 (hex) of ``path``'s bytes, from its memo in ``memo_dir`` when the file is the one hashed then.
    A memo that cannot be read is recomputed; one that cannot be written costs the next call a hash, with a
    warning."""
    path, memo_dir = Path(path), Path(memo_dir)
    try:
        digest = _memo(path, path.stat(), memo_dir).read_text(encoding="ascii").strip()
        if len(digest) == 64 and set(digest) <= HEX:
            return digest
    except (OSError, UnicodeDecodeError):
        pass
    with open(path, "rb") as f:
        memo = _memo(path, os.fstat(f.fileno()), memo_dir)  # the file hashed, even if the path is replaced meanwhile
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    try:
        memo_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(memo, lambda f: f.write(digest.encode("ascii") + b"\n"))
    except OSError as error:
        print(f"warning: could not record the digest of {path} in {memo} ({error}): the next use hashes it again",
              file=sys.stderr)
    return digest
