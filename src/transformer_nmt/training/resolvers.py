"""The OmegaConf resolvers the Hydra configs use, registered by one explicit call (never by an import).

- ``${run_name:RUN_ID}``: ``hydra.run.dir``'s last component (run_dir.run_name);
- ``${sweep_name:SWEEP_ID}``: ``hydra.sweep.dir``'s (run_dir.sweep_name);
- ``${by_precision:{PRECISION: VALUE, ...}}``: a recipe setting that follows the run's precision
  (precision.by_precision).

Whatever composes a config that uses them calls ``register_resolvers()`` first: the apps (train.py,
prepare.py) before Hydra composes, the scripts and the tests before ``compose``.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from transformer_nmt.training.precision import by_precision
from transformer_nmt.training.run_dir import run_name, sweep_name

# name: (function, use_cache). run_name and by_precision read the composed config (_root_): not cached.
RESOLVERS = {"run_name": (run_name, False), "sweep_name": (sweep_name, True), "by_precision": (by_precision, False)}


def register_resolvers() -> None:
    """Register the resolvers above with OmegaConf; calling it again changes nothing (a resolver already
    registered under one of the names is kept, so a cached ``sweep_name`` keeps its value)."""
    for name, (function, use_cache) in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function, use_cache=use_cache)
