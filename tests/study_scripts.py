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
