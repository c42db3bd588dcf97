"""Which checkpoint a launch resumes, the same on every rank.

``ckpt_path=auto`` resumes from the newest checkpoint in the run directory, if any (``resume_checkpoint``), as
global rank 0 found it (``agree_on_resume``), which is what a restarted or requeued job needs (slurm.SlurmRequeue).
A job that requeued itself leaves a note in the run dir (``run_files.REQUEUED``, slurm.note_requeue): its next
launch resumes the newest checkpoint whatever ``ckpt_path`` says (``requeued_resume``), since the requeued job runs
the same command, and ``ckpt_path=null`` or a file would otherwise start it over. ``choose_resume`` is the three
together, as a run asks them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from lightning.pytorch.plugins.environments import LightningEnvironment

from transformer_nmt import run_files
from transformer_nmt.checkpoint import checkpoint_step
from transformer_nmt.training.run_dir import LaunchError
from transformer_nmt.training.slurm import slurm_job

log = logging.getLogger(__name__)

REQUEUE_MARK = "requeued SLURM job"  # in requeued_resume's start-up line
RESUME_ENV = "TRANSFORMER_NMT_RESUME"  # rank 0's choice, for the child processes of Lightning's own launcher


def choose_resume(ckpt_path: str | None, run_dir: Path, trainer) -> tuple[Path | None, str]:
    """(the checkpoint this launch resumes or None, its start-up line), as global rank 0 chose it: a requeued SLURM
    job's own (``requeued_resume``), else ``ckpt_path``'s (``resume_checkpoint``), agreed on every rank
    (``agree_on_resume``). ``trainer``: the run's, not fitted yet."""
    choice = requeued_resume(ckpt_path, run_dir) or resume_checkpoint(ckpt_path, run_dir)
    agreed = agree_on_resume(choice, trainer)
    if not trainer.is_global_zero:
        log.info("rank %d resumes as global rank 0 chose: %s", trainer.global_rank, agreed[1])
    return agreed


def resume_checkpoint(ckpt_path: str | None, run_dir: Path) -> tuple[Path | None, str]:
    """(checkpoint to resume from or None, one line for the start-up summary).

    ``auto``: the newest (by step) of ``checkpoints/last.ckpt`` and Lightning's ``hpc_ckpt_*.ckpt`` in the
    run dir, else a fresh start; ``last``: the same, but a missing one is an error; ``null``: fresh; else
    a path.
    """
    if ckpt_path is None:
        return None, "fresh start (ckpt_path=null)"
    if ckpt_path not in ("auto", "last"):
        path = Path(ckpt_path)
        if not path.is_file():
            raise LaunchError(f"ckpt_path={ckpt_path}: no such file (ckpt_path=auto resumes this run dir's last "
                              f"checkpoint when it has one)")
        return path, f"from {path}, step {checkpoint_step(path)} (ckpt_path={ckpt_path})"
    candidates = [p for p in [run_files.last_checkpoint(run_dir), *run_dir.glob(run_files.HPC_PATTERN)] if p.is_file()]
    if not candidates:
        if ckpt_path == "last":
            raise LaunchError(f"ckpt_path=last: no {run_files.CHECKPOINTS}/{run_files.LAST} in {run_dir}; "
                              f"pass the run's directory (run_id=NAME or hydra.run.dir=DIR) to resume it")
        return None, f"fresh start: no checkpoint in {run_dir} (ckpt_path=auto)"
    steps = {path: checkpoint_step(path) for path in candidates}
    path = max(candidates, key=lambda p: (steps[p], p.stat().st_mtime))
    return path, f"from {path}, step {steps[path]} (ckpt_path={ckpt_path})"


def requeued_resume(ckpt_path: str | None, run_dir: Path, environ=os.environ) -> tuple[Path, str] | None:
    """The checkpoint this launch resumes because it is a requeued SLURM job, with its start-up line, else None.

    A job that requeued itself (``note_requeue``: the note names this job, ``slurm_job``) runs the same command
    again: with ``ckpt_path=null`` it would start over, with ``ckpt_path=FILE`` from FILE again, and overwrite what
    the requeue saved. Such a launch resumes the run dir's newest checkpoint (as ``ckpt_path=auto``) instead; None
    when this is not a requeued job, when ``ckpt_path`` is ``auto`` or ``last`` (they resume it already), or when the
    job was requeued before it saved anything (it starts as its command says, as its first launch did). A note
    of another job (a new submission reusing the run dir) is ignored: that launch does what its command says."""
    if ckpt_path in ("auto", "last") or not environ.get("SLURM_JOB_ID"):
        return None
    note_path = run_dir / run_files.REQUEUED
    if not note_path.is_file():
        return None
    try:
        note = json.loads(note_path.read_text(encoding="utf-8"))
        job = note["slurm_job"]
    except (ValueError, KeyError, TypeError) as error:
        log.warning("%s is not a requeue note (%s): ignored; ckpt_path=%s applies", note_path, error, ckpt_path)
        return None
    if job != slurm_job(environ):
        return None
    path, _ = resume_checkpoint("auto", run_dir)
    if path is None:
        return None
    given = "null" if ckpt_path is None else ckpt_path
    return path, (f"from {path}, step {checkpoint_step(path)} ({REQUEUE_MARK} {job}: it resumes what its requeue "
                  f"saved; ckpt_path={given} was for its first launch)")


def is_requeue_resume(line: str) -> bool:
    """Whether ``line`` (the resume line every rank agreed on, ``agree_on_resume``) is ``requeued_resume``'s: the
    run dir's own checkpoint, resumed whatever ``ckpt_path`` says."""
    return f"({REQUEUE_MARK} " in line


def agree_on_resume(choice: tuple[Path | None, str], trainer) -> tuple[Path | None, str]:
    """Global rank 0's ``resume_checkpoint`` choice, on every rank: each rank reads the run dir itself, and on a
    shared file system one may see a newer ``last.ckpt`` than another (a directory listing cached on one node);
    ranks that resumed different files would train from different states. ``trainer``: the run's, not fitted yet.

    - One process: its own choice.
    - Rank 0 of a launcher that starts the other ranks in fit (Lightning's own, ``trainer=ddp`` outside torchrun
      and SLURM): its choice, also written to ``$TRANSFORMER_NMT_RESUME``, which the children inherit.
    - A child of that launcher (Lightning's environment, the variable set): the parent's choice.
    - Ranks started together by torchrun, srun or by hand: they join the process group now (Lightning's own
      set-up in fit then finds it joined) and take rank 0's choice (``broadcast_choice``).
    """
    if trainer.world_size == 1:
        return choice
    strategy = trainer.strategy
    if strategy.launcher is not None:
        os.environ[RESUME_ENV] = json.dumps([None if choice[0] is None else str(choice[0]), choice[1]])
        return choice
    if isinstance(strategy.cluster_environment, LightningEnvironment) and RESUME_ENV in os.environ:
        path, line = json.loads(os.environ[RESUME_ENV])
        return (None if path is None else Path(path)), line
    strategy.setup_environment()
    return broadcast_choice(choice, strategy.broadcast, trainer.global_rank)


def broadcast_choice(choice: tuple[Path | None, str], broadcast, rank: int) -> tuple[Path | None, str]:
    """Rank 0's (path, summary line) through ``broadcast`` (``Strategy.broadcast``: every rank calls it, each
    gets rank 0's object); a rank whose own choice differed says so."""
    path, line = broadcast([None if choice[0] is None else str(choice[0]), choice[1]])
    agreed = (None if path is None else Path(path)), line
    if agreed[0] != choice[0]:
        log.warning("rank %d found %s in the run dir, rank 0 %s: every rank resumes rank 0's choice", rank,
                    choice[0] or "no checkpoint", agreed[0] or "no checkpoint")
    return agreed
