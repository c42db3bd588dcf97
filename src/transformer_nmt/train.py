"""``python -m transformer_nmt.train [experiment=...] [key=value ...]``: fit, then test, from a Hydra config.

The configs are the package's own (``transformer_nmt/conf``, ``train.yaml`` first); ``--help`` lists the
groups and every option with its default and help (training/config.py), ``--cfg job`` prints the composed
config. The run itself: training/app.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from transformer_nmt.training.app import finished_already, train
from transformer_nmt.training.config import register_configs
from transformer_nmt.training.resolvers import register_resolvers

register_configs()  # conf/train.yaml composes over the schemas (training/config.py)
register_resolvers()  # before Hydra composes (hydra.run.dir: ${run_name:}); here, so a launcher's worker has them too


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # Lightning logs through its own handler; send its messages to Hydra's (console and RUN_DIR/train.log).
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    hydra_config = HydraConfig.get()
    overrides, sweep = list(hydra_config.overrides.task), hydra_config.mode == RunMode.MULTIRUN
    if sweep and finished_already(cfg, Path(hydra_config.runtime.output_dir), overrides):
        return
    train(cfg, hydra_config.runtime.output_dir, overrides=overrides, sweep=sweep)


if __name__ == "__main__":
    main()
