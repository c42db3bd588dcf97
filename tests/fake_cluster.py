"""A cluster's pieces, faked on one machine: a free loopback port for torchrun's rendezvous, and a stand-in for
SLURM's ``scontrol`` that records its calls."""

import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SCONTROL = "#!/bin/sh\necho \"$@\" >> \"$SCONTROL_LOG\"\n"  # stands in for SLURM's scontrol: records the call


def fake_scontrol(directory: Path) -> Path:
    """DIRECTORY/bin holding an executable ``scontrol`` that appends its arguments to $SCONTROL_LOG; returns
    the bin directory, to put first on PATH."""
    (directory / "bin").mkdir()
    (directory / "bin" / "scontrol").write_text(SCONTROL)
    (directory / "bin" / "scontrol").chmod(0o755)
    return directory / "bin"
