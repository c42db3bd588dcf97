"""The names of what a training run writes under its run directory (``outputs/NAME/RUN_ID``), each defined
once: the app, the callbacks, the resume logic and the scripts that read runs all take them from here.

    RUN_DIR/config.yaml                  the resolved config
    RUN_DIR/results.json                 the run's summary; its presence marks the run finished
    RUN_DIR/val_hypotheses.txt           the last validation's greedy translations, line i: sentence i
    RUN_DIR/val_references.txt           their references
    RUN_DIR/checkpoints/last.ckpt        the newest state, for resuming
    RUN_DIR/checkpoints/recent/          the rolling window for checkpoint averaging
    RUN_DIR/tensorboard/                 TensorBoard's event files
    RUN_DIR/hpc_ckpt_N.ckpt              Lightning's own SLURM auto-requeue checkpoints, if it wrote any
    RUN_DIR/.hydra/                      Hydra's config.yaml, hydra.yaml, overrides.yaml (the command's)
    RUN_DIR/train.log                    Hydra's job log (train_rank_N.log: another rank's)

``WRITTEN_INTO`` and ``WRITTEN_IN_PLACE`` name what of these a launch writes into or through (a directory, a file
opened for writing or appending), ``REPLACED`` what it replaces atomically: training/planted_links.py checks them.
"""

from __future__ import annotations

from pathlib import Path

CONFIG = "config.yaml"
RESULTS = "results.json"
HYPOTHESES, REFERENCES = "val_hypotheses.txt", "val_references.txt"
CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
RECENT = "recent"
AVERAGED = "averaged.ckpt"  # what transformer_nmt.reproduce averages the recent window into
TENSORBOARD = "tensorboard"
HPC_PATTERN = "hpc_ckpt_*.ckpt"
REQUEUED = "requeued.json"  # slurm.SlurmRequeue's note: this SLURM job requeued itself; its next launch resumes
EVAL = "eval"  # beside a checkpoint: what evaluate writes by default
LOCK = ".lock"  # held (flock) by the launch that runs there, and naming it (run_dir_lock.run_dir_lock)
HYDRA = ".hydra"  # hydra.output_subdir: Hydra writes the command's configs there before the app runs
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
LOG_PATTERN = "*.log"  # Hydra's job log, RUN_DIR/${hydra.job.name}.log (train.log; train_rank_N.log)
HPARAMS = "hparams.yaml"  # TensorBoardLogger's, in tensorboard/

# glob patterns under RUN_DIR: directories a launch writes files into; files it opens for writing (or appending)
# in place; files it replaces atomically (durable.atomic_write, AtomicCheckpointIO)
WRITTEN_INTO = (HYDRA, CHECKPOINTS, f"{CHECKPOINTS}/{RECENT}", TENSORBOARD)
WRITTEN_IN_PLACE = (*(f"{HYDRA}/{name}" for name in HYDRA_FILES), LOG_PATTERN, f"{TENSORBOARD}/{HPARAMS}", LOCK)
REPLACED = (CONFIG, RESULTS, HYPOTHESES, REFERENCES, REQUEUED, HPC_PATTERN, f"{CHECKPOINTS}/*.ckpt",
            f"{CHECKPOINTS}/{RECENT}/*.ckpt")


def last_checkpoint(run_dir: str | Path) -> Path:
    """RUN_DIR/checkpoints/last.ckpt."""
    return Path(run_dir) / CHECKPOINTS / LAST
