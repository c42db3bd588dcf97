"""Checkpoint files: written atomically, read back into a model and its tokenizer.

A checkpoint is a Lightning checkpoint (weights, optimizer, schedule, loop and sampler state) plus
what a later ``evaluate``/``translate`` needs and nothing else: the TransformerConfig as a plain
dict and the serialized SentencePiece model (training/module.py adds both). Everything in it is a plain
Python container, tensor or bytes, so ``torch.load(path, weights_only=True)`` reads it.

Writing goes to ``PATH.tmp-<pid>`` in the same directory, is flushed to disk, then renamed over
``PATH`` with ``os.replace`` (atomic on POSIX): a process killed mid-write leaves the previous
``PATH`` untouched, never a truncated one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.data.tokenizer import Tokenizer
# Keys this project adds to a Lightning checkpoint, so that it is self-contained (training/module.py writes them).
CKPT_MODEL_CONFIG = "transformer_config"
CKPT_TOKENIZER = "tokenizer_model_proto"
# Only where the tokenizer has them (an imported model): the target side's SentencePiece model, and the joint
# vocabulary (a list of pieces in id order) that maps both models' pieces to ids (data/tokenizer.py).
CKPT_TARGET_TOKENIZER = "target_tokenizer_model_proto"
CKPT_TOKENIZER_PIECES = "tokenizer_pieces"
CKPT_DATA_CONFIG = "data_config"  # the data config (plain dict) the model was trained on
MODEL_PREFIX = "model."  # TranslationModule holds the Transformer as ``self.model``


class CheckpointError(ValueError):
    """A file that is not a usable transformer_nmt checkpoint; the message names the file."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file next to ``path``, fsync, then rename it over ``path``."""
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """``write(file)`` into a temporary file next to ``path``, fsync, then rename it over ``path``: a process
    killed meanwhile leaves the previous file, or none, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)


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
    except (ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {path}: its tokenizer does not load: {error}") from error


def checkpoint_step(path: str | os.PathLike) -> int:
    """A checkpoint's global step (optimizer steps), read without reading its tensors."""
    return int(read_checkpoint(path, mmap=True).get("global_step") or 0)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu"
                    ) -> tuple[Transformer, Tokenizer, dict]:
    """A checkpoint -> (Transformer in eval mode, its Tokenizer, meta).

    ``meta``: path, epoch, global_step, the training hyper-parameters (plain dict), the model config
    and the data config (None if not recorded); nothing else is needed to translate with the checkpoint.
    """
    checkpoint = read_checkpoint(path)
    config = TransformerConfig(**checkpoint[CKPT_MODEL_CONFIG])
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
            "data_config": checkpoint.get(CKPT_DATA_CONFIG)}
    return model.to(map_location).eval(), tokenizer, meta
