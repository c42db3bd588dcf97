"""Checkpoint files: written atomically, read back into a model and its tokenizer.

A checkpoint is a Lightning checkpoint (weights, optimizer, schedule, loop and sampler state) plus
what a later ``evaluate``/``translate`` needs and nothing else: the TransformerConfig as a plain
dict and the serialized SentencePiece model (training/module.py adds both). Everything in it is a plain
Python container, tensor or bytes, so ``torch.load(path, weights_only=True)`` reads it.

Writing goes to a fresh temporary file ``PATH.tmp-XXXXXXXX`` in the same directory (``durable.atomic_write``:
``mkstemp``), is flushed to disk, then renamed over ``PATH`` with ``os.replace`` (atomic on POSIX): a process
killed mid-write leaves the previous ``PATH`` untouched, never a truncated one.

Reading is ``torch.load(weights_only=True)`` (``read_checkpoint``): tensors and plain containers, no object of
any other class is built and no code the file names runs; the configs inside are rebuilt as dataclasses with
their keys and types checked (records.from_record), never instantiated. Lightning's own loads (resume,
``trainer.test(ckpt_path=...)``) go through the same reader (training/checkpoint_io.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.durable import atomic_write  # noqa: F401 (the checkpoint writer's home until 2026-12)
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.records import RecordError, from_record

# Keys this project adds to a Lightning checkpoint, so that it is self-contained (training/module.py writes them).
CKPT_MODEL_CONFIG = "transformer_config"
CKPT_TOKENIZER = "tokenizer_model_proto"
# Only where the tokenizer has them (an imported model): the target side's SentencePiece model, and the joint
# vocabulary (a list of pieces in id order) that maps both models' pieces to ids (data/tokenizer.py).
CKPT_TARGET_TOKENIZER = "target_tokenizer_model_proto"
CKPT_TOKENIZER_PIECES = "tokenizer_pieces"
CKPT_DATA_CONFIG = "data_config"  # the data config (plain dict) the model was trained on
CKPT_VERSION = "transformer_nmt_version"  # the package version that wrote the checkpoint (absent before 2026-12)
CKPT_RUN = "training_run"  # the training run (one id from its fresh start through every resume): what averaging checks
CKPT_FINGERPRINT = "run_fingerprint"  # the settings that define the run (training/fingerprint.py)
CKPT_OVERRIDES = "run_overrides"  # the command line's overrides (a sweep job's: Hydra's overrides.task)
MODEL_PREFIX = "model."  # TranslationModule holds the Transformer as ``self.model``


class CheckpointError(ValueError):
    """A file that is not a usable transformer_nmt checkpoint; the message names the file."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file next to ``path``, fsync, then rename it over ``path``."""
    atomic_write(path, lambda f: torch.save(obj, f))


def read_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict:
    """``torch.load(path, weights_only=True)`` with errors that name the file and say what is wrong.
    ``mmap=True`` maps the tensors instead of reading them: pages are read only when a tensor is used."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist (expected e.g. RUN_DIR/checkpoints/last.ckpt)")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): its writer was interrupted; use another one")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # truncated zip, foreign pickle, text file, ...
        raise CheckpointError(f"checkpoint {path} cannot be read by torch.load(weights_only=True): it is truncated, "
                              f"corrupt or not a checkpoint ({type(error).__name__}: {str(error)[:200]})") from error
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    missing = [key for key in ("state_dict", CKPT_MODEL_CONFIG, CKPT_TOKENIZER) if key not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a transformer_nmt training checkpoint: it lacks {missing} "
                              f"(write checkpoints with python -m transformer_nmt.train)")
    for key, kind in (("state_dict", dict), (CKPT_MODEL_CONFIG, dict), (CKPT_TOKENIZER, bytes)):
        if not isinstance(checkpoint[key], kind):
            raise CheckpointError(f"checkpoint {path}: {key} is a {type(checkpoint[key]).__name__}, not a "
                                  f"{kind.__name__}: the file is damaged or was not written by transformer_nmt")
    return checkpoint


def tokenizer_entries(tokenizer: Tokenizer) -> dict:
    """What a checkpoint stores of ``tokenizer``: its SentencePiece model, and the target model and the joint
    vocabulary where it has them."""
    entries = {CKPT_TOKENIZER: tokenizer.model_proto}
    if tokenizer.target_proto is not None:
        entries[CKPT_TARGET_TOKENIZER] = tokenizer.target_proto
    if tokenizer.pieces is not None:
        entries[CKPT_TOKENIZER_PIECES] = tokenizer.pieces
    return entries


def checkpoint_tokenizer(checkpoint: dict, path: str | os.PathLike) -> Tokenizer:
    """The tokenizer that checkpoint ``checkpoint`` (read from ``path``, named in errors) stores."""
    target, pieces = checkpoint.get(CKPT_TARGET_TOKENIZER), checkpoint.get(CKPT_TOKENIZER_PIECES)
    if not isinstance(checkpoint[CKPT_TOKENIZER], bytes) or not (target is None or isinstance(target, bytes)):
        raise CheckpointError(f"checkpoint {path}: {CKPT_TOKENIZER} and {CKPT_TARGET_TOKENIZER} must be bytes "
                              f"(serialized SentencePiece models)")
    if pieces is not None and not (isinstance(pieces, list) and all(isinstance(p, str) for p in pieces)):
        raise CheckpointError(f"checkpoint {path}: {CKPT_TOKENIZER_PIECES} must be a list of strings")
    try:
        return Tokenizer(checkpoint[CKPT_TOKENIZER], target, pieces)
    except (TypeError, ValueError, RuntimeError) as error:  # not a SentencePiece model
        raise CheckpointError(f"checkpoint {path}: {CKPT_TOKENIZER} is not a usable SentencePiece model "
                              f"({str(error).strip().splitlines()[0][:200]})") from None


def checkpoint_step(path: str | os.PathLike) -> int:
    """A checkpoint's global step (optimizer steps), read without reading its tensors."""
    return int(read_checkpoint(path, mmap=True).get("global_step") or 0)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu"
                    ) -> tuple[Transformer, Tokenizer, dict]:
    """A checkpoint -> (Transformer in eval mode, its Tokenizer, meta).

    ``meta``: path, epoch, global_step, the training hyper-parameters (plain dict), the model config,
    the data config (None if not recorded; a plain record, read with ``DataConfig.from_record``) and the
    version that wrote the checkpoint (None if not recorded); nothing else is needed to translate with it.
    """
    checkpoint = read_checkpoint(path)
    version = checkpoint.get(CKPT_VERSION)
    try:
        config = from_record(TransformerConfig, checkpoint[CKPT_MODEL_CONFIG], f"checkpoint {path}",
                             CKPT_MODEL_CONFIG, version)
    except RecordError as error:
        raise CheckpointError(str(error)) from None
    model = Transformer(config)
    weights = {key[len(MODEL_PREFIX):]: value for key, value in checkpoint["state_dict"].items()
               if key.startswith(MODEL_PREFIX)}
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        raise CheckpointError(f"checkpoint {path}: weights do not match its own model config: {error}") from error
    tokenizer = checkpoint_tokenizer(checkpoint, path)
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(f"checkpoint {path}: tokenizer has {tokenizer.vocab_size} pieces but the model "
                              f"{config.vocab_size}")
    meta = {"path": str(path), "epoch": checkpoint.get("epoch"), "global_step": checkpoint.get("global_step"),
            "hyper_parameters": checkpoint.get("hyper_parameters", {}), "model_config": config.to_dict(),
            "data_config": checkpoint.get(CKPT_DATA_CONFIG), "version": version}
    return model.to(map_location).eval(), tokenizer, meta
