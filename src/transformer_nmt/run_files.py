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
REQUEUED = "requeued.json"  # launch.SlurmRequeue's note: this SLURM job requeued itself; its next launch resumes
EVAL = "eval"  # beside a checkpoint: what evaluate writes by default


def last_checkpoint(run_dir: str | Path) -> Path:
    """RUN_DIR/checkpoints/last.ckpt."""
    return Path(run_dir) / CHECKPOINTS / LAST
