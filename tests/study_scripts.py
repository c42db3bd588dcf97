"""Loading a script of studies/ in a test, as ``python studies/NAME.py`` runs it (its imports of studies/ resolve)."""

import importlib.util
import sys
from pathlib import Path

STUDIES = Path(__file__).resolve().parents[1] / "studies"


def load_study(name: str):
    """The module of ``studies/NAME.py``, under a name of its own (``script_NAME``)."""
    sys.path.insert(0, str(STUDIES))
    try:
        spec = importlib.util.spec_from_file_location(f"script_{name}", STUDIES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(STUDIES))
    return module


def train_steps_in_process(monkeypatch, study) -> list[list[str]]:
    """Make ``study``'s ``run_step`` run its ``transformer_nmt.train`` steps in this process (``training.app.train``
    on the composed config: the command's overrides, ``hydra.run.dir=`` as the run directory), which saves a Python
    start and the imports of torch and Lightning per run; skipping a step whose output exists stays run_step's own.
    Any other command still runs as a subprocess. Returns the list the train commands are appended to."""
    from tiny_corpus import compose_train

    from transformer_nmt.training.app import train

    original, commands = study.run_step, []

    def run_step(name, done, command):
        if command[0] != "transformer_nmt.train" or done.exists():
            return original(name, done, command)
        commands.append(command)
        run_dir = next(Path(a.split("=", 1)[1]) for a in command if a.startswith("hydra.run.dir="))
        print(f"[{name}] in process: {' '.join(command)}", flush=True)
        train(compose_train(*(a for a in command[1:] if not a.startswith("hydra.run.dir="))), run_dir)
        if not done.exists():
            raise AssertionError(f"[{name}] ended without writing {done}")
        return 0.0

    monkeypatch.setattr(study, "run_step", run_step)
    return commands
