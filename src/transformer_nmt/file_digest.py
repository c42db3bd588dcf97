"""The sha256 of a file's bytes, hashed once per version of the file.

Caches keyed by a file's path, size and modification time serve stale entries when the file is replaced by
another one of the same size with its time kept (``cp -p``, ``rsync -a``, an image with normalised times): the
caches of this package are keyed by content instead (``content_digest``). Hashing a checkpoint or a corpus on
every use would read gigabytes, so the digest is memoized under ``memo_dir`` by the file's whole identity: its
resolved path, device, inode, size, modification and status-change times. A file rewritten or replaced has a new
status-change time (the kernel sets it at every write and rename; ``cp -p``, ``rsync -a`` and image layers restore
the modification time, never that one) or a new inode, hence no memo: its bytes are hashed again. A file changed
in the last two seconds is hashed but not memoized (a second write within the same status-change time tick would
keep its identity).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from transformer_nmt.durable import atomic_write

HEX = frozenset("0123456789abcdef")
CHUNK = 1 << 20  # bytes read at a time
RACY_NS = 2_000_000_000  # a file changed this recently may change again within the same ctime tick: not memoized


def user_cache() -> Path:
    """``$XDG_CACHE_HOME/transformer_nmt`` (default ``~/.cache/transformer_nmt``): the CTranslate2 export cache and
    the digests' memos of files outside a data cache (checkpoints, the fingerprint's training files)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transformer_nmt"


def _memo(path: Path, stat: os.stat_result, memo_dir: Path) -> Path:
    identity = (f"{path.resolve()}\0{stat.st_dev}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}\0"
                f"{stat.st_ctime_ns}")
    return memo_dir / hashlib.sha256(identity.encode()).hexdigest()[:32]


def content_digest(path: str | os.PathLike, memo_dir: str | os.PathLike | None = None) -> str:
    """The sha256 (hex) of ``path``'s bytes, from its memo in ``memo_dir`` (None: ``user_cache()/digests``, which
    every cache of the package shares, so that a file is hashed once whoever asks) when the file is the one hashed
    then. A memo that cannot be read is recomputed; one that cannot be written costs the next call a hash, with a
    warning."""
    path = Path(path)
    memo_dir = user_cache() / "digests" if memo_dir is None else Path(memo_dir)
    try:
        digest = _memo(path, path.stat(), memo_dir).read_text(encoding="ascii").strip()
        if len(digest) == 64 and set(digest) <= HEX:
            return digest
    except (OSError, UnicodeDecodeError):
        pass
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())  # the file hashed, even if the path is replaced meanwhile
        memo = _memo(path, stat, memo_dir)
        sha = hashlib.sha256()
        while chunk := f.read(CHUNK):
            sha.update(chunk)
        digest = sha.hexdigest()
    if time.time_ns() - stat.st_ctime_ns < RACY_NS:  # a write within the same ctime tick would keep this identity
        return digest
    try:
        memo_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(memo, lambda f: f.write(digest.encode("ascii") + b"\n"))
    except OSError as error:
        print(f"warning: could not record the digest of {path} in {memo} ({error}): the next use hashes it again",
              file=sys.stderr)
    return digest
