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
their keys and types checked (records.from_record), never instantiated; the model config's sizes are checked
against sane bounds (``MODEL_LIMITS``) and against the shapes of the weights the file holds before any model is
built (``model_config_of``): a damaged or crafted config cannot make a reader allocate what it names. Lightning's
own loads (resume, ``trainer.test(ckpt_path=...)``) go through the same reader (training/checkpoint_io.py).

A checkpoint an older version wrote is brought to today's layout as it is read, in one place
(``migrate_checkpoint``): no model or training code knows an old layout.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.durable import atomic_write
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.model.uninitialised import uninitialised
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
CKPT_RAW_WEIGHTS = "raw_state_dict"  # an EMA run's trained weights (its state_dict holds the average: training/ema.py)
MODEL_PREFIX = "model."  # TranslationModule holds the Transformer as ``self.model``

# The largest value of each size of a model config read from a file: far above any Transformer trained for
# translation (the paper's big model: d_model 1024, d_ff 4096, 16 heads, 6+6 layers, 37000 pieces), far below
# what would exhaust a machine's memory on load. A checkpoint above them is damaged or crafted.
MODEL_LIMITS = {"vocab_size": 2 ** 21, "d_model": 2 ** 16, "d_ff": 2 ** 18, "n_heads": 2 ** 10, "d_k": 2 ** 16,
                "d_v": 2 ** 16, "n_encoder_layers": 2 ** 10, "n_decoder_layers": 2 ** 10, "max_positions": 2 ** 20,
                "attention_block_size": 2 ** 16}
POSITION_TABLE_LIMIT = 2 ** 28  # max_positions x d_model: the sinusoid table is built, never read from the file


class CheckpointError(ValueError):
    """A file that is not a usable transformer_nmt checkpoint; the message names the file."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file next to ``path``, fsync, then rename it over ``path``."""
    atomic_write(path, lambda f: torch.save(obj, f))


def read_checkpoint(path: str | os.PathLike, mmap: bool = False, training_state: bool = False) -> dict:
    """``torch.load(path, weights_only=True)`` with errors that name the file and say what is wrong, in today's
    layout (``migrate_checkpoint``; ``training_state``: the reader restores a trainer from it, see there).
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
    check_stored_sizes(checkpoint, f"checkpoint {path}")  # before any reader (migrate_checkpoint first) copies one
    missing = [key for key in ("state_dict", CKPT_MODEL_CONFIG, CKPT_TOKENIZER) if key not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a transformer_nmt training checkpoint: it lacks {missing} "
                              f"(write checkpoints with python -m transformer_nmt.train)")
    for key, kind in (("state_dict", dict), (CKPT_MODEL_CONFIG, dict), (CKPT_TOKENIZER, bytes)):
        if not isinstance(checkpoint[key], kind):
            raise CheckpointError(f"checkpoint {path}: {key} is a {type(checkpoint[key]).__name__}, not a "
                                  f"{kind.__name__}: the file is damaged or was not written by transformer_nmt")
    return migrate_checkpoint(checkpoint, f"checkpoint {path}", training_state)


# The most tensors of a checkpoint may describe, against the values it stores (each storage once): a checkpoint this
# project writes describes at most about 3x (a tied embedding read under its source, target and output names, in the
# weights and again in an EMA run's trained weights, each pair of dicts its own storages). A file that describes more
# is crafted: copying its tensors (averaging, stacking, casting Adam's state) would allocate what it does not hold.
VIEWS_PER_VALUE = 4


def tensors_of(node) -> list[tuple[str, torch.Tensor]]:
    """(where, tensor) for every tensor inside ``node`` (a checkpoint: dicts, lists, tuples at any depth), ``where``
    its path (``state_dict/model.x``, ``optimizer_states[0]/...``) for an error."""
    found, stack = [], [("", node)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append((where or "a tensor", item))
        elif isinstance(item, dict):
            stack.extend((f"{where}/{key}" if where else str(key), value) for key, value in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{i}]", value) for i, value in enumerate(item))
    return found


def check_stored_sizes(checkpoint: dict, source: str) -> None:
    """``CheckpointError`` (naming ``source`` and the tensor) unless what the checkpoint's tensors describe is bounded
    by what the file stores: no tensor holds more values than its storage (a stride-0 or overlapping view,
    ``torch.zeros(1).expand(n)``, would be materialized by any copy: averaging's float64 sum, stacking an old layout,
    Adam's state cast to its parameter's dtype), and all of them together no more than ``VIEWS_PER_VALUE`` times the
    values stored (many views of one storage). Every reader of a checkpoint runs it (``read_checkpoint``), before
    anything is copied; it reads no tensor's data (memory-mapped files stay unread)."""
    named = tensors_of(checkpoint)
    tensors = [tensor for _, tensor in named]
    for name, tensor in named:
        values = tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1)
        if tensor.numel() > values:
            raise CheckpointError(f"{source}: {name} has shape {tuple(tensor.shape)} ({tensor.numel():,} values) but "
                                  f"its storage holds {values:,} (a view that repeats stored values): the file is "
                                  f"damaged or crafted; refusing to read it")
    described, held = sum(tensor.numel() for tensor in tensors), stored_values(tensors)
    if described > VIEWS_PER_VALUE * held:
        raise CheckpointError(f"{source}: its tensors describe {described:,} values but the file stores {held:,} "
                              f"(more than {VIEWS_PER_VALUE} views of each stored value): the file is damaged or "
                              f"crafted; refusing to read it")


_SEPARATE_QKV = re.compile(r"(.*)\.q_proj\.(weight|bias)")
OLD_LEARNED_POSITIONS, LEARNED_POSITIONS = MODEL_PREFIX + "positions", MODEL_PREFIX + "positions.weight"



def migrate_checkpoint(checkpoint: dict, source: str, training_state: bool = False) -> dict:
    """``checkpoint`` (a checkpoint dict; ``source`` names it in errors) in today's layout, converted in place
    where an older version wrote another: the one place that knows old checkpoint layouts, applied by
    ``read_checkpoint`` to every read (evaluate, translate, average, export, init_from, Lightning's loads).
    ``training_state``: the reader restores a trainer from it (Lightning's loads: resume,
    ``trainer.test(ckpt_path=...)``), where a layout that its optimizer state cannot follow is refused.

    - Before the fused Q/K/V projection (2026-11-29), each attention module held ``q_proj``, ``k_proj`` and
      ``v_proj`` apart: their weights and biases are stacked into ``in_proj``. The optimizer state holds them
      apart, so such a checkpoint's weights load, but it cannot resume training (``CheckpointError``).
    - Before positions were modules (2026-12-03), a learned position table was the model's parameter
      ``positions``; it is ``positions.weight`` now, in the trained and in the EMA run's raw weights. The
      parameter order is unchanged, so the optimizer state still follows and such a checkpoint resumes.

    Older records inside a checkpoint are read where exports and run directories, which hold them too, are
    read: a data config's ``_target_`` (``DataConfig.from_record``), a run fingerprint's keys
    (training/fingerprint.py)."""
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict):
        return checkpoint
    fused = False
    for match in [m for m in map(_SEPARATE_QKV.fullmatch, list(state)) if m]:
        prefix, kind = match.groups()
        separate = [f"{prefix}.{name}_proj.{kind}" for name in "qkv"]
        if all(key in state for key in separate):
            try:
                stacked = torch.cat([state[key] for key in separate])
            except (RuntimeError, TypeError) as error:
                raise CheckpointError(f"{source}: {prefix}.q_proj/k_proj/v_proj.{kind} cannot be stacked into "
                                      f"in_proj ({str(error)[:200]}): the file is damaged") from None
            for key in separate:
                del state[key]
            state[f"{prefix}.in_proj.{kind}"], fused = stacked, True
    for weights in (state, checkpoint.get(CKPT_RAW_WEIGHTS)):
        if isinstance(weights, dict) and OLD_LEARNED_POSITIONS in weights:
            weights[LEARNED_POSITIONS] = weights.pop(OLD_LEARNED_POSITIONS)
    if fused and training_state and "optimizer_states" in checkpoint:
        raise CheckpointError(f"{source} predates the fused Q/K/V projection (in_proj): its weights load for "
                              f"evaluate, translate and average, but its optimizer state cannot resume training")
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


def vocabulary_entries(checkpoint: dict) -> tuple | None:
    """What a checkpoint records of its tokenizer (``tokenizer_entries``), as one comparable value: the source
    SentencePiece model, the target one and the joint vocabulary (pieces in id order), as ``Tokenizer.identity``
    gives them; None where it records no tokenizer."""
    if checkpoint.get(CKPT_TOKENIZER) is None:
        return None
    pieces = checkpoint.get(CKPT_TOKENIZER_PIECES)
    return (checkpoint[CKPT_TOKENIZER], checkpoint.get(CKPT_TARGET_TOKENIZER),
            None if pieces is None else tuple(pieces))


# The data options that say what a model translates: from which language into which. A multilingual data config
# adds its language sets here; models that differ in any of them are never one ensemble or one average.
LANGUAGE_FIELDS = ("src_lang", "tgt_lang", "pairs", "lang_tags")  # pairs, lang_tags: a model of several (data.pairs)


def translation_languages(data_config) -> tuple | None:
    """((option, value), ...) of ``LANGUAGE_FIELDS`` in ``data_config``, a checkpoint's data record
    (``CKPT_DATA_CONFIG``; a field it lacks has DataConfig's default, as ``DataConfig.from_record`` reads it; a list
    as a tuple); None where the checkpoint records no data config (an imported model)."""
    if not isinstance(data_config, dict):
        return None
    defaults = {f.name: f.default for f in fields(DataConfig)}
    values = {name: data_config.get(name, defaults.get(name)) for name in LANGUAGE_FIELDS}
    if not values["pairs"]:  # a model of one pair: its languages alone, as before data.pairs
        values = {name: values[name] for name in ("src_lang", "tgt_lang")}
    return tuple((name, tuple(value) if isinstance(value, list) else value) for name, value in values.items())


def describe_languages(languages: tuple | None) -> str:
    """``data.src_lang=en data.tgt_lang=de`` (``translation_languages``), or that none is recorded."""
    if languages is None:
        return "no data config (its languages unknown)"
    return " ".join(f"data.{name}={value!r}" for name, value in languages)


def model_config_of(checkpoint: dict, source: str) -> TransformerConfig:
    """The model config a checkpoint (``read_checkpoint``'s dict; ``source`` names it in errors) records, checked
    before anything is built: its fields and types (records.from_record), each size within ``MODEL_LIMITS``, each
    weight the file holds of the shape the config gives it, and no more weights described than the file holds in
    storage (``stored_values``: a stride-0 view of one stored value does not count as the weights its shape
    claims; a tied weight counts once on both sides; the model is laid out on the meta device, which allocates
    nothing; a weight may be absent under its name in a
    checkpoint not yet brought to today's layout, e.g. q_proj/k_proj/v_proj before ``migrate_checkpoint`` stacks
    them into in_proj). So what a reader allocates is bounded by what the file holds. ``CheckpointError`` naming
    the field or the weight."""
    version = checkpoint.get(CKPT_VERSION)
    record = checkpoint.get(CKPT_MODEL_CONFIG)
    if isinstance(record, dict):
        for field, limit in MODEL_LIMITS.items():
            value = record.get(field)
            if isinstance(value, int) and value > limit:
                raise CheckpointError(f"{source}: {CKPT_MODEL_CONFIG}.{field}={value} is above {limit}, the most a "
                                      f"model read from a file may have: the file is damaged or was not written by "
                                      f"transformer_nmt; refusing to build it")
    try:
        config = from_record(TransformerConfig, record, source, CKPT_MODEL_CONFIG, version)
    except RecordError as error:
        raise CheckpointError(str(error)) from None
    if config.max_positions * config.d_model > POSITION_TABLE_LIMIT:
        raise CheckpointError(f"{source}: {CKPT_MODEL_CONFIG}.max_positions={config.max_positions} x d_model="
                              f"{config.d_model} is a position table above {POSITION_TABLE_LIMIT} values: the file is "
                              f"damaged or crafted; refusing to build it")
    # Shapes only, on the meta device: nothing is allocated, nothing initialised. A tied weight: one tensor, two names.
    state = uninitialised(Transformer, config, device="meta").state_dict(keep_vars=True)
    expected = {key: tuple(value.shape) for key, value in state.items()}
    weights = {key: value for key, value in (checkpoint.get("state_dict") or {}).items()
               if key.startswith(MODEL_PREFIX) and isinstance(value, torch.Tensor)}
    described = (f"vocab_size {config.vocab_size}, d_model {config.d_model}, d_ff {config.d_ff}, layers "
                 f"{config.n_encoder_layers}+{config.n_decoder_layers}")
    for key, shape in expected.items():
        found = weights.get(MODEL_PREFIX + key)
        if found is not None and tuple(found.shape) != shape:
            raise CheckpointError(f"{source}: its model config does not describe its weights: {MODEL_PREFIX}{key} is "
                                  f"{tuple(found.shape)} in the file, {shape} by the config ({described}): the file is "
                                  f"damaged or was not written by transformer_nmt")
    needed = sum(value.numel() for value in {id(value): value for value in state.values()}.values())
    held = stored_values(weights.values())
    if needed > held:
        raise CheckpointError(f"{source}: its model config describes {needed:,} weights ({described}) but the file "
                              f"holds {held:,} (values stored, each storage counted once: a view that repeats or "
                              f"shares stored values holds no more): the file is damaged or was not written by "
                              f"transformer_nmt")
    return config


def stored_values(tensors) -> int:
    """How many values ``tensors`` hold in storage, each storage counted once (in the element size of a tensor
    viewing it): what a file really holds, not what its tensors' shapes claim. A view whose shape exceeds its storage
    (``torch.zeros(1).expand(n)``, stride 0) or tensors sharing a storage (a tied weight) add no more than the
    storage; ``numel`` would count the view's shape."""
    storages: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        key = storage.data_ptr() or id(storage)  # an empty storage has no address
        storages[key] = max(storages.get(key, 0), storage.nbytes() // max(tensor.element_size(), 1))
    return sum(storages.values())


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
    config = model_config_of(checkpoint, f"checkpoint {path}")  # checked before the model is built
    model = uninitialised(Transformer, config)  # no random draws for weights the file's replace (a strict load)
    own = model.state_dict()
    weights = {key[len(MODEL_PREFIX):]: value for key, value in checkpoint["state_dict"].items()
               if key.startswith(MODEL_PREFIX)}
    # The file's tensors become the model's (assign: no copy), in the model's dtype and layout as a copy would give.
    weights = {key: value.to(own[key].dtype).contiguous() if key in own and isinstance(value, torch.Tensor) else value
               for key, value in weights.items()}
    try:
        model.load_state_dict(weights, assign=True)
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
