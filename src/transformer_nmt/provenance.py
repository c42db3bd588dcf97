"""What made a results file: the code (git commit, dirty or not), the packages' versions, the machine (CPU model
and flags, GPU, threads, load), the command line and the resolved config, as one plain dict.

Every results file the project writes records it under the key ``provenance`` (``PROVENANCE_KEY``): a run's
``results.json``, ``evaluate``'s ``NAME.json``, the recipe's ``reproduce.json``, the benchmarks' raw output.
It is cheap (two ``git`` calls, no package imported to read its version) and never fails: where something cannot
be known (no git checkout, git missing, no /proc) its value is None and ``git.error`` or the field says why.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from transformer_nmt.hardware import available_cpus, cpu_model, isa_variables, reported_cpu_flags

PROVENANCE_KEY = "provenance"
PACKAGES = ("transformer_nmt", "torch", "lightning", "hydra-core", "sacrebleu", "sentencepiece", "ctranslate2",
            "sacremoses")  # distribution names; None where not installed
PACKAGE_DIR = Path(__file__).resolve().parent  # src/transformer_nmt in a checkout


MAX_CHANGED_LISTED = 200  # a dirty tree's changed paths recorded (the digest covers every tracked change)


def git_state(package_dir: Path = PACKAGE_DIR) -> dict:
    """``{"commit", "dirty", "changed", "diff_sha256", "error"}`` of the checkout this package runs from: ``git
    rev-parse HEAD``; whether ``git status --porcelain`` lists anything (tracked changes or untracked files that are
    not ignored); the paths it lists (at most MAX_CHANGED_LISTED); and the SHA-256 of ``git diff HEAD --binary``
    (None when no tracked file differs), so that a result made on a dirty tree names what it ran beyond the commit.
    Not a checkout (an installed wheel, an archive), or no git: all but ``error`` None, ``error`` says which."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=package_dir, capture_output=True, text=True, check=True,
                              timeout=30).stdout

    def unknown(error: str) -> dict:
        return {"commit": None, "dirty": None, "changed": None, "diff_sha256": None, "error": error}

    try:
        top = Path(git("rev-parse", "--show-toplevel").strip()).resolve()
        if top / "src" / "transformer_nmt" != package_dir:  # a wheel inside some other repository
            return unknown(f"{package_dir} is not this project's checkout")
        status = git("-c", "core.quotePath=false", "status", "--porcelain", "--untracked-files=all")
        changed = [line[3:] for line in status.splitlines() if line.strip()]
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=top, capture_output=True, check=True,
                              timeout=60).stdout
        digest = hashlib.sha256(diff).hexdigest() if diff else None
        return {"commit": git("rev-parse", "HEAD").strip(), "dirty": bool(changed),
                "changed": changed[:MAX_CHANGED_LISTED], "diff_sha256": digest, "error": None}
    except FileNotFoundError:
        return unknown("git not found")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
        message = getattr(error, "stderr", None) or str(error)
        message = message.decode(errors="replace") if isinstance(message, bytes) else message
        return unknown(f"not a git checkout ({message.strip()})")


def versions(packages=PACKAGES) -> dict:
    """Installed version of each distribution (importlib.metadata: nothing is imported), None where missing."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def torch_state() -> dict:
    """Thread count and GPU names, read only from a torch this process has imported already (so that recording
    provenance never imports torch or initialises CUDA in a process that did not)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"torch_threads": None, "gpus": None}
    gpus = None
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"torch_threads": torch.get_num_threads(), "gpus": gpus}


def collect(config: dict | None = None, argv: list[str] | None = None) -> dict:
    """The provenance of a results file written now: ``config`` is the resolved config (a plain dict; None where
    the command has none), ``argv`` the command line (default ``sys.argv``)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": git_state(),
        "versions": versions(),
        "cpu_model": cpu_model(),
        "cpu_flags": reported_cpu_flags(),
        "cpus": available_cpus(),
        **torch_state(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "isa_variables": isa_variables(),
        "load_average": load,
        "platform": platform.platform(),
        "argv": list(sys.argv if argv is None else argv),
        "config": config,
    }


def provenance_line(config: dict | None = None) -> str:
    """``provenance: {JSON}`` on one line: what a benchmark prints first, so that its raw output says what made it."""
    return f"{PROVENANCE_KEY}: {json.dumps(collect(config))}"
