"""``python -m transformer_nmt.train [experiment=...] [key=value ...]``: fit, then test, from a Hydra config.

The configs are the package's own (``transformer_nmt/conf``, ``train.yaml`` first); ``--help`` lists the
groups and every option with its default and help (training/config.py), ``--cfg job`` prints the composed
config. The run itself: training/app.py.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from transformer_nmt.training.config import register_configs
from transformer_nmt.training.planted_links import refuse_planted_links
from transformer_nmt.training.resolvers import register_resolvers

register_configs()  # conf/train.yaml composes over the schemas (training/config.py)
register_resolvers()  # before Hydra composes (hydra.run.dir: ${run_name:}); here, so a launcher's worker has them too


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def app(cfg: DictConfig) -> None:
    # Lightning logs through its own handler; send its messages to Hydra's (console and RUN_DIR/train.log).
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    hydra_config = HydraConfig.get()
    overrides, sweep = list(hydra_config.overrides.task), hydra_config.mode == RunMode.MULTIRUN
    run_dir = Path(hydra_config.runtime.output_dir)
    # the job log's handler (planted_links.RunDirLogFile) refused these before Hydra wrote .hydra/; again here where
    # hydra.job_logging was replaced: before the lock, the skip decision's read of results.json and the run
    refuse_planted_links(run_dir)
    # the run's code (Lightning with it) imported here, not above: --help, --cfg and a sweep's launching process,
    # which composes the jobs and hands them to a launcher, never train
    from transformer_nmt.training.app import train

    train(cfg, run_dir, overrides=overrides, sweep=sweep)  # under the run dir's lock; a finished sweep job: skipped


def rank_overrides(environ=os.environ) -> list[str]:
    """Hydra overrides for a rank other than global rank 0 of processes that torchrun or srun started, every one
    running this command into the same run dir: no ``.hydra/`` (rank 0 writes it) and its own log,
    ``train_rank_N.log``, beside rank 0's train.log (as Lightning's own launcher does for its child processes,
    which it starts with its own overrides)."""
    rank = environ.get("RANK")  # torchrun's
    if rank is None and int(environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_ID" in environ:
        rank = environ.get("SLURM_PROCID")  # a task of srun
    if rank in (None, "", "0"):
        return []
    return ["hydra.output_subdir=null", f"hydra.job.name=train_rank_{rank}"]


def main() -> None:
    """The command (``python -m transformer_nmt.train``, ``transformer-nmt-train``): Hydra's app, with
    ``rank_overrides`` after the command line's."""
    sys.argv += rank_overrides()
    app()


if __name__ == "__main__":
    main()
