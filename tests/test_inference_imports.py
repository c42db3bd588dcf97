"""Inference imports no training: translate, evaluate, average and export (and every module of inference/) load
without Lightning or transformer_nmt.training, which would cost every translate call their import time. And the train
command's module loads no Lightning until it trains: --help, --cfg and a sweep's launching process don't pay for it."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import transformer_nmt.inference

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("lightning", "pytorch_lightning", "lightning_fabric", "transformer_nmt.training")
INFERENCE_MODULES = [f"transformer_nmt.inference.{m.name}"
                     for m in pkgutil.iter_modules(transformer_nmt.inference.__path__)]
PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
forbidden = {forbidden!r}
print(json.dumps(sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))))
"""


def loaded_forbidden(modules: list[str], forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    """The ``forbidden`` modules that importing ``modules`` in a fresh interpreter loads."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(forbidden=forbidden), *modules], capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


COMMANDS = [f"transformer_nmt.{command}" for command in ("translate", "evaluate", "average", "export")]


def test_inference_commands_and_modules_import_no_training():
    """One fresh interpreter imports them all: if any of them loaded training, the union would hold it."""
    assert len(INFERENCE_MODULES) >= 7  # translate, evaluate, average, export, ctranslate2_engine, alignment, ...
    assert loaded_forbidden(COMMANDS + INFERENCE_MODULES) == []


def test_the_probe_sees_training():
    """The check can fail: importing the training package is seen (its __init__ alone: cheap to import)."""
    assert loaded_forbidden(["transformer_nmt.training"]) == ["transformer_nmt.training"]


def test_the_train_command_loads_lightning_only_to_train():
    """transformer_nmt.train composes configs (schemas, resolvers, the run dir's guards) without Lightning: the run's
    code is imported by the app when it runs (the probe can fail: test_the_probe_sees_training; a module-level
    import of training.app in train.py fails this test)."""
    assert loaded_forbidden(["transformer_nmt.train"], forbidden=FORBIDDEN[:3]) == []  # lightning and its aliases
