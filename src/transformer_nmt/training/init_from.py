"""A fine-tune's parent (``init_from``): its checkpoint read and checked before anything is built, its tokenizer
and digest, and, with ``init_keep``, the checkpoint a fresh run continues the parent's training from."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig

from transformer_nmt.checkpoint import (
    CKPT_FINGERPRINT,
    CKPT_MODEL_CONFIG,
    CheckpointError,
    checkpoint_tokenizer,
    model_config_of,
    read_checkpoint,
)
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.file_digest import content_digest
from transformer_nmt.training.callbacks import RecordFingerprint
from transformer_nmt.training.config import ConfigError
from transformer_nmt.training.continuation import (
    ContinuationError,
    check_same_training,
    check_trains_something,
    continuation_checkpoint,
)
from transformer_nmt.training.fingerprint import INIT_DIGEST, recorded_init, run_fingerprint
from transformer_nmt.training.precision import uses_cuda

log = logging.getLogger(__name__)


@dataclass
class Parent:
    """What a fine-tune reads of its parent."""

    checkpoint: dict  # init_from's checkpoint (read_init: its model config checked)
    tokenizer: Tokenizer | None  # the vocabulary it was trained with, the fine-tune's
    digest: str  # the sha256 of init_from's file as it was read, or as the run's own checkpoint records it
    recorded_run: dict | None  # where init_from is gone: the parent as the resumed checkpoint records it
    keep: list[str]  # init_keep: what of the parent's training goes on


def read_parent(cfg: DictConfig, ckpt_path: Path | None, callbacks: list[pl.Callback],
                trainer: pl.Trainer) -> Parent | None:
    """``init_from``'s parent (None without one), checked: its model config, that a continuation (``init_keep``,
    a fresh start: ``ckpt_path`` None) would train something, and that ``data.tokenizer_path`` is its vocabulary.
    Where init_from is gone and the run resumes its own checkpoint, ``callbacks``' RecordFingerprint records the
    parent as that checkpoint does. A ``ConfigError`` naming the option otherwise."""
    if not cfg.get("init_from"):
        return None
    init_path, recorded_run = init_source(cfg, ckpt_path)
    if recorded_run is not None:  # init_from is gone: the parent as this run's own checkpoint records it
        next(c for c in callbacks if isinstance(c, RecordFingerprint)).recorded_run = recorded_run
    init = read_init(init_path)  # fine-tune: weights, tokenizer
    digest = (recorded_init(recorded_run)[INIT_DIGEST] if recorded_run is not None
              else content_digest(init_path))  # the file as it was read
    keep = list(cfg.get("init_keep") or [])
    if keep and ckpt_path is None:  # a continuation that would train nothing is refused before the data is prepared
        try:
            check_trains_something(init, keep, f"init_from={cfg.init_from}", trainer.max_steps, trainer.max_epochs)
        except ContinuationError as error:
            raise ConfigError(str(error)) from None
    tokenizer = checkpoint_tokenizer(init, cfg.init_from)
    if tokenizer is not None and cfg.data.get("tokenizer_path"):
        check_same_vocabulary(tokenizer, cfg.init_from, cfg.data.tokenizer_path)
    return Parent(init, tokenizer, digest, recorded_run, keep)


def read_init(path: str) -> dict:
    """``init_from``'s checkpoint, its model config checked before anything is built or prepared
    (checkpoint.model_config_of: fields this version knows, sane sizes, the shapes of the weights it holds); a
    ``ConfigError`` naming ``init_from``, the file and the field otherwise."""
    init = read_checkpoint(path)
    try:
        config = model_config_of(init, f"init_from={path}")
    except CheckpointError as error:
        raise ConfigError(str(error)) from None
    return {**init, CKPT_MODEL_CONFIG: config.to_dict()}


def init_source(cfg: DictConfig, ckpt_path: Path | None) -> tuple[str, dict | None]:
    """(the checkpoint a fine-tune reads its architecture, tokenizer and first weights from, the fingerprint that
    stands for its parent or None): ``init_from``'s file; where that file is gone (a ``recent/`` checkpoint the
    parent's window removed) and the run resumes a checkpoint of its own (``ckpt_path``), that checkpoint, which
    holds all of them (the resume then restores its weights), and the parent's digest and architecture as its
    fingerprint records them (fingerprint.recorded_init). A ``ConfigError`` naming init_from otherwise."""
    init_from = str(cfg.init_from)
    if Path(init_from).is_file():
        return init_from, None
    if ckpt_path is None:
        raise ConfigError(f"init_from={init_from} does not exist: give the checkpoint to fine-tune from")
    recorded = read_checkpoint(ckpt_path, mmap=True).get(CKPT_FINGERPRINT)
    if not recorded_init(recorded):
        raise ConfigError(f"init_from={init_from} does not exist, and {ckpt_path}, the checkpoint this run resumes, "
                          f"records no digest of it: restore init_from's checkpoint to resume")
    log.warning("init_from=%s no longer exists: the run resumes %s, which holds the architecture, tokenizer and "
                "weights, and records the parent's digest (%s)", init_from, ckpt_path, recorded[INIT_DIGEST][:12])
    return str(ckpt_path), recorded


def check_same_vocabulary(init_tokenizer, init_from: str, tokenizer_path: str) -> None:
    """A fine-tune (``init_from``) keeps its checkpoint's vocabulary: the embeddings' rows are its pieces. A
    ``data.tokenizer_path`` naming another SentencePiece model is refused, with the reason; the same one is fine."""
    try:
        given = Tokenizer.load(tokenizer_path)
    except (OSError, RuntimeError, ValueError) as error:
        raise ConfigError(f"data.tokenizer_path={tokenizer_path}: cannot be read ({error})") from None
    if given != init_tokenizer:
        raise ConfigError(f"init_from={init_from} with data.tokenizer_path={tokenizer_path}: that is another "
                          f"vocabulary than the checkpoint's ({given.vocab_size:,} pieces, the checkpoint's "
                          f"{init_tokenizer.vocab_size:,}, or other pieces): the embeddings' rows are the "
                          f"checkpoint's pieces and would no longer match. A fine-tune uses the checkpoint's own "
                          f"vocabulary: drop data.tokenizer_path")


@contextlib.contextmanager
def continued_from(parent: Parent | None, ckpt_path: Path | None, cfg: DictConfig, module, trainer: pl.Trainer):
    """The checkpoint the fit starts from: ``ckpt_path``, or for a fresh start that continues the parent's training
    (``init_keep``) a temporary one (``write_continuation``) that Lightning restores, removed after the block."""
    if parent is None or not parent.keep or ckpt_path is not None:
        yield ckpt_path
        return
    continued = write_continuation(parent.checkpoint, parent.keep, cfg, module, trainer)
    try:
        yield continued
    finally:
        continued.unlink(missing_ok=True)


def write_continuation(init: dict, keep: list[str], cfg: DictConfig, module,
                       trainer: pl.Trainer) -> Path:
    """A temporary file holding the checkpoint a fresh run with ``init_keep`` starts from
    (``continuation.continuation_checkpoint``): each process writes its own and removes it after the fit."""
    configured = module.configure_optimizers()  # this run's optimizer and schedule, unstepped (a throwaway)
    scheduler = configured["lr_scheduler"]["scheduler"]
    fresh_optimizer = configured["optimizer"].state_dict()
    # built before the module is on its device: the fused kernel as configure_optimizers picks it on the run's device
    fused = True if cfg.train.fused_adam and uses_cuda(str(cfg.trainer.get("accelerator", "auto"))) else None
    fresh_optimizer["param_groups"] = [{**group, "fused": fused} for group in fresh_optimizer["param_groups"]]
    ema = ({"decay": float(cfg.train.ema_decay), "warmup": bool(cfg.train.get("ema_warmup", True))}
           if cfg.train.get("ema_decay") is not None else None)
    try:
        check_same_training(init, keep, f"init_from={cfg.init_from}", run_fingerprint(cfg, trainer))
        checkpoint = continuation_checkpoint(
            init, keep, f"init_from={cfg.init_from}", fresh_optimizer=fresh_optimizer,
            fresh_scheduler=scheduler.state_dict(), schedule=scheduler.lr_lambdas[0],
            fresh_loops=trainer.fit_loop.state_dict(), training_run=module.training_run, ema=ema)
    except ContinuationError as error:
        raise ConfigError(str(error)) from None
    handle, name = tempfile.mkstemp(prefix="init-keep-", suffix=".ckpt")
    os.close(handle)
    torch.save(checkpoint, name)
    return Path(name)
