"""What defines a run, so that ``ckpt_path=auto`` resumes only the run this command started.

The fingerprint is the ``model``, ``data`` and ``train`` config groups and ``seed``, flattened to dotted keys
(``model.dropout``, ``train.lr_factor``, ``data.max_tokens``): whatever keys the groups hold, so a new setting
is covered without being listed here, plus ``TRAINER_KEYS`` (``trainer.accumulate_grad_batches``: the tokens
per optimizer step; gradient clipping is ``train.clip_grad_norm``). Left out is what a resumed run may change
without training something else: the rest of the ``trainer`` group (devices, nodes, precision, max_steps,
max_time, logging), checkpointing, attention maps, names and directories, and ``MAY_CHANGE``: how many processes
load the data, where caches live, the validation and test sets, and how evaluation batches and how many
sentences it decodes for BLEU, and how the same arithmetic is computed (the attention kernel, fused Adam).

Every checkpoint carries the fingerprint of the run that wrote it (``RecordFingerprint``). Resuming the run
dir's own checkpoint (``ckpt_path=auto`` or ``last``) with another fingerprint is refused (``check_resume``):
inside one SLURM allocation, or after a relaunch with another learning rate, the directory holds another run,
and continuing its weights and schedule under new settings trains neither run. ``force_resume=true`` resumes
anyway; an explicit ``ckpt_path=FILE`` (fine-tuning from another run) is never checked.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.checkpoint import CKPT_FINGERPRINT, CKPT_OVERRIDES, read_checkpoint  # noqa: F401 (the keys)

log = logging.getLogger(__name__)

GROUPS = ("model", "data", "train")
TRAINER_KEYS = ("trainer.accumulate_grad_batches",)  # the trainer settings that change what a step trains
MAY_CHANGE = ("data.num_workers", "data.num_proc", "data.cache_dir",  # how many processes load the data, caches
              "data.val", "data.test", "data.eval_max_tokens",  # evaluation
              "train.val_bleu_max_sentences", "train.test_bleu_max_sentences",
              "model.attention", "model.attention_block_size", "train.fused_adam")  # kernels: the same arithmetic
# Keys that older runs recorded but that define nothing: data._target_ (the datamodule's class, in the data config
# until the structured configs of 2026-12; one path before the package's layout, another after). Ignored on both
# sides, so that such a run resumes and a finished one is skipped.
RETIRED = ("data._target_",)
# Keys added since, whose value here is what every run did before them: a run that lacks one ran with this value.
ADDED = {"model.activation": "relu", "model.output_bias": False}


class ResumeError(ValueError):
    """A checkpoint that this command must not resume; the message names each differing key and the fix."""


def _flatten(value: Any, prefix: str, out: dict) -> dict:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}", out)
    else:
        out[prefix] = value
    return out


def run_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """{dotted key: resolved value} of what defines the run (see the module doc)."""
    found: dict[str, Any] = {"seed": cfg.seed, **{key: OmegaConf.select(cfg, key) for key in TRAINER_KEYS}}
    for group in GROUPS:
        _flatten(OmegaConf.to_container(cfg[group], resolve=True), group, found)
    return {key: value for key, value in sorted(found.items()) if key not in MAY_CHANGE + RETIRED}


def fingerprint_digest(cfg: DictConfig) -> str:
    """A short hash of ``run_fingerprint(cfg)``: names a ``torchrun --standalone`` run dir (launch.job_identity)."""
    encoded = json.dumps(run_fingerprint(cfg), sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:10]


class RecordFingerprint(Callback):
    """Writes the run's fingerprint and overrides into every checkpoint it saves (keys ``run_fingerprint``,
    ``run_overrides``)."""

    def __init__(self, fingerprint: dict[str, Any], overrides: list[str]):
        self.fingerprint, self.overrides = fingerprint, overrides

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[CKPT_FINGERPRINT] = self.fingerprint
        checkpoint[CKPT_OVERRIDES] = self.overrides


def _override(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def differences(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (saved value, current value)} for each key whose value differs ("absent" where one lacks it); the
    ``RETIRED`` keys of an older run's ``saved`` fingerprint are not compared, and an ``ADDED`` key it lacks has
    its value there."""
    absent = "absent"
    saved, current = ({**ADDED, **fingerprint} for fingerprint in (saved, current))
    return {key: (saved.get(key, absent), current.get(key, absent)) for key in sorted(saved.keys() | current.keys())
            if key not in RETIRED and saved.get(key, absent) != current.get(key, absent)}


def check_resume(cfg: DictConfig, path: Path | None, sweep_overrides: list[str] | None = None) -> None:
    """Refuse to resume ``path``, the run dir's own checkpoint, when it was written by a run with another
    fingerprint than ``cfg``'s, or, in a sweep (``sweep_overrides``: this job's), by a job with other overrides;
    ``force_resume=true`` and explicit checkpoint paths are not checked."""
    if path is None or cfg.ckpt_path not in ("auto", "last") or cfg.get("force_resume"):
        return
    checkpoint = read_checkpoint(path, mmap=True)
    if sweep_overrides is not None:
        step = checkpoint.get("global_step")
        check_same_job(checkpoint.get(CKPT_OVERRIDES), sweep_overrides, f"{path} (step {step})",
                       f"delete {path.parent.parent} to train this job from the start, or pass force_resume=true to "
                       f"resume it anyway")
    saved = checkpoint.get(CKPT_FINGERPRINT)
    if saved is None:
        log.warning("%s predates run fingerprints: its settings cannot be compared with this command's", path)
        return
    check_same_run(cfg, saved, f"ckpt_path={cfg.ckpt_path} found {path} (step {checkpoint.get('global_step')}), "
                               f"written by a run", "Resuming it would continue that run's weights and schedule")


def check_finished_run(cfg: DictConfig, config_file: Path, saved_overrides: list[str] | None,
                       overrides: list[str]) -> None:
    """Refuse to skip a sweep's finished run (its ``config_file``, the resolved config it ran with, and the
    overrides its results.json holds) when it ran with other settings or overrides than this job's ``cfg`` and
    ``overrides``: its results are not this command's. ``force_resume`` does not apply: a finished run is not
    resumed, and skipping it would report the old settings' results as this command's."""
    run_dir = config_file.parent
    check_same_job(saved_overrides, overrides, f"the sweep's run in {run_dir} finished; it",
                   f"delete {run_dir / 'results.json'} to train this job")
    changed = differences(run_fingerprint(OmegaConf.load(config_file)), run_fingerprint(cfg))
    if changed:
        raise ResumeError(
            f"the sweep's run in {run_dir} finished, but it ran with other settings than this command's:\n"
            f"{_lines(changed)}\nSkipping it would report its results as this command's. To train it with this "
            f"command's settings, delete {run_dir / 'results.json'}; to keep it, run this command under a new "
            f"sweep_id=NAME.")


def check_same_job(saved: list[str] | None, overrides: list[str], found: str, fix: str) -> None:
    """In a sweep run again, job N's directory must hold job N: raise ``ResumeError`` when ``saved``, the
    overrides it ran with (None: not recorded), differ from this job's ``overrides``, which happens when the
    sweep's values were reordered, added or removed (run dirs are numbered in sweep order)."""
    if saved is None or list(saved) == list(overrides):
        return
    raise ResumeError(
        f"{found} ran with the overrides\n  {' '.join(saved)}\nbut this sweep gives that job the overrides\n  "
        f"{' '.join(overrides)}\nThe sweep's values or their order changed, so the directory holds another run. Run "
        f"the changed sweep under a new sweep_id=NAME, or the old command again; or {fix}.")


def check_same_run(cfg: DictConfig, saved: dict[str, Any], found: str, consequence: str) -> None:
    """Raise ``ResumeError`` when ``saved`` differs from ``cfg``'s fingerprint: one line per key, and the fixes."""
    changed = differences(saved, run_fingerprint(cfg))
    if not changed or cfg.get("force_resume"):
        return
    as_it_was = " ".join(f"~{key}" if old == "absent" else f"{key}={_override(old)}"
                         for key, (old, new) in changed.items())
    raise ResumeError(
        f"{found} with other settings than this command's:\n{_lines(changed)}\n{consequence} under the new settings. "
        f"To resume it as it was, pass {as_it_was}; to start a new run, give it its own directory (run_id=NAME or "
        f"hydra.run.dir=DIR; in a sweep, sweep_id=NAME); to resume it with the new settings anyway, pass "
        f"force_resume=true.")


def _lines(changed: dict[str, tuple[Any, Any]]) -> str:
    return "\n".join(f"  {key}: {_override(old)} there, {_override(new)} now" for key, (old, new) in changed.items())
