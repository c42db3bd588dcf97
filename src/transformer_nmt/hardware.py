"""What the machine offers: the CPU's feature flags, its cores, and whether it computes bf16 natively.

The environment variable ``TRANSFORMER_NMT_CPU_BF16=native|emulated`` makes the CPU answer as one with
or without native bf16, whatever its flags: the test suite runs precision ``auto``'s CPU branch both ways
on any machine.
"""

from __future__ import annotations

import os
from pathlib import Path

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
REPORTED_CPU_FLAGS = ("avx2", *NATIVE_BF16_CPU_FLAGS)  # as lscpu | grep -o 'avx512_bf16\|amx_bf16\|avx2'
CPU_BF16_ENV = "TRANSFORMER_NMT_CPU_BF16"
CPU_BF16_ANSWERS = ("native", "emulated")
# What holds a process below its CPU's instruction set, read once when each library loads: torch's own kernels
# (ATen), MKL's and oneDNN's (torch's and CTranslate2's), and CTranslate2's (its ISA and whether it uses MKL on a
# CPU that is not Intel's). AVX2 on a host with AVX-512 is the code path of an AVX2-only host.
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA",
                 "CT2_USE_MKL")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo ``flags`` line); empty where that file is missing."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name (/proc/cpuinfo's first ``model name`` line); None where that file or line is missing."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return None


def reported_cpu_flags(flags=None) -> list[str]:
    """The flags every report names (``REPORTED_CPU_FLAGS``, in that order) found in ``flags``, by default this
    CPU's: what ``lscpu | grep -o 'avx512_bf16\\|amx_bf16\\|avx2' | sort -u`` prints."""
    flags = cpu_flags() if flags is None else set(flags)
    return [flag for flag in REPORTED_CPU_FLAGS if flag in flags]


def available_cpus() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_native_bf16() -> tuple[bool, str]:
    """(whether the CPU computes bf16 natively, the evidence): ``TRANSFORMER_NMT_CPU_BF16`` where it is set,
    else the native-bf16 flags found in /proc/cpuinfo (an empty string where there are none)."""
    answer = os.environ.get(CPU_BF16_ENV)
    if answer:
        if answer not in CPU_BF16_ANSWERS:
            raise ValueError(f"{CPU_BF16_ENV}={answer!r}: use one of {CPU_BF16_ANSWERS}, or unset it to read "
                             f"the CPU's flags")
        return answer == "native", f"{CPU_BF16_ENV}={answer}"
    found = sorted(set(NATIVE_BF16_CPU_FLAGS) & cpu_flags())
    return bool(found), ", ".join(found)


def isa_variables(environ=os.environ) -> dict[str, str]:
    """The ISA_VARIABLES this process was started with (name -> value; those unset left out)."""
    return {name: environ[name] for name in ISA_VARIABLES if name in environ}
