"""The package's Hydra configs (``train.yaml``, ``prepare.yaml`` and their groups), shipped inside the wheel:
``pkg://transformer_nmt.conf`` on Hydra's search path, ``CONF_DIR`` on disk."""

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent
