"""Export a checkpoint to a CTranslate2 model directory, built with CTranslate2's own model-spec API (or, with
``format=marian``, to a transformers MarianMT directory: interchange/marian.py).

    python -m transformer_nmt.export ckpt=RUN/averaged.ckpt output=RUN/ct2
    python -m transformer_nmt.export ckpt=RUN/averaged.ckpt output=RUN/ct2_int8 quantization=int8

(The command, transformer_nmt/export.py, reads the options, ``ExportOptions``, and hands each format to its
exporter: this module, or interchange/marian.py.)

``quantization``: ``none`` (float32 weights, the default) or one of CTranslate2's weight types (``int8``,
``int8_float32``, ``float16``, ...). A float32 export can also be quantized when it is loaded (the
``compute_type`` option of ``translate``). The directory holds CTranslate2's ``model.bin``,
``config.json`` and ``shared_vocabulary.json``, plus ``sentencepiece.model`` and ``transformer_nmt.json``
(our model and data config, so ``translate``/``evaluate`` need nothing else, the version that wrote it, and
every other file of the directory with its size: ``check_export`` compares them on every load, so a truncated
``model.bin`` is refused, and in the cache exported again). The directory is built under a fresh temporary name
beside ``output`` (``mkdtemp``), fsynced, then renamed into place. ``force=true`` replaces an earlier export, and
nothing else (a run dir, a directory with other files: refused, with what it holds named), and only once the new
one is complete: the old one is moved aside, the new one renamed in, then the old one removed
(``durable.replace_directory``).

How our model maps onto CTranslate2's ``TransformerSpec``:
- post-norm or pre-norm (``pre_norm``; pre-norm's final norms are the stacks' ``layer_norm``); LayerNorm (eps
  1e-5) or RMSNorm (``rms_norm``, eps 1e-6), CTranslate2's ``layer_norm_epsilon`` the model's (model/norms.py);
- embeddings scaled by sqrt(d_model) (``scale_embeddings``); tied or untied matrices (tied ones are stored once);
- positions: our sinusoid table is given explicitly, because ours interleaves sin and cos
  (PE[:, 2i] = sin, PE[:, 2i+1] = cos) where CTranslate2's built-in one concatenates [sin | cos]; a learned
  table likewise; rotary as CTranslate2's ``rotary_dim=0`` (every feature), ``rotary_interleave=False`` (halves
  paired, as ours), base 10000, in self-attention only; ``positions=none`` is refused (CTranslate2 always adds
  positions);
- vocabulary: the SentencePiece pieces in id order, so CTranslate2 id == our id; its unk/bos/eos tokens are
  the pieces of our ids 1/2/3; the decoder starts from bos, and eos is appended to every source;
- the feed-forward: relu, swish or gelu; swiglu and geglu as ``ffn_glu`` (W1 is ``linear_0``, the linear branch
  ``linear_0_noact``) with swish or gelu; the model's ``output_bias``, if any, is the output layer's bias, but:
- the output layer gets a bias of -1e4 on pad and bos, which are never valid outputs (``forbid_special``
  in decoding): exp(-1e4) underflows to 0, so every other log-probability is unchanged.
Dropout, attention dropout and the attention kernel do not exist at inference and are ignored.
Each position scheme, activation and norm states its CTranslate2 form where it is registered (``ctranslate2=``
of its ``PositionScheme``, ``Activation``, ``Norm``: model/export_forms.py); one that states none, or says it has
none, is refused, naming the option (``model.positions=NAME: ...``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from filelock import FileLock

from transformer_nmt import __version__
from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.durable import (
    check_replaceable,
    fsync_directory,
    publish_directory,
    replace_directory,
    temporary_directory,
)
from transformer_nmt.file_digest import content_digest, user_cache
from transformer_nmt.model.export_forms import form_of
from transformer_nmt.model.feed_forward import ACTIVATIONS
from transformer_nmt.model.hooks import hooked_modules
from transformer_nmt.model.norms import NORMS
from transformer_nmt.model.positions import POSITION_SCHEMES, ROTARY_BASE
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.options import option

EXPORT_INFO = "transformer_nmt.json"  # our configs, beside CTranslate2's files
EXPORT_FORMAT = 2  # part of the cache key: bump when the export of a given checkpoint changes (2: files listed)
SENTENCEPIECE_MODEL = "sentencepiece.model"
FORBIDDEN_LOGIT_BIAS = -1e4  # on pad and bos; finite so float16 and int8 exports keep it


@dataclass
class ExportOptions:
    ckpt: Optional[str] = option(None, "a checkpoint written by python -m transformer_nmt.train")
    output: Optional[str] = option(None, "the CTranslate2 model directory to write")
    quantization: str = option("none", "none (float32 weights) | int8 | int8_float32 | float16 | ... "
                                       "(CTranslate2's weight types)")
    force: bool = option(False, "replace output if it is an earlier export (a directory of nothing but the files an "
                                "export writes; anything else is refused, named); the new export is complete before "
                                "the old one leaves")
    format: str = option("ctranslate2", "ctranslate2 | marian: a transformers MarianMT directory "
                                        "(interchange/marian.py; pip install -e .[hf])")




def import_ctranslate2():
    """The ctranslate2 module, or an error that says how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise SystemExit('CTranslate2 is not installed: pip install -e ".[serve]" (or pip install "ctranslate2>=4.8")'
                         ) from None
    return ctranslate2


def check_quantization(quantization: str) -> str | None:
    """``quantization`` option -> CTranslate2's weight type (None = float32 as trained)."""
    accepted = import_ctranslate2().specs.model_spec.ACCEPTED_MODEL_TYPES
    if quantization in ("none", None):
        return None
    if quantization not in accepted:
        raise SystemExit(f"quantization={quantization!r}: use none or one of {', '.join(accepted)}")
    return quantization


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _set_linear(spec, linear: torch.nn.Linear, rows: slice = slice(None)) -> None:
    """Fill a LinearSpec from output rows ``rows`` of ``linear``."""
    spec.weight = _array(linear.weight[rows])  # (d_out, d_in)
    if linear.bias is not None:
        spec.bias = _array(linear.bias[rows])


def _set_layer_norm(spec, norm: torch.nn.Module) -> None:
    """A LayerNorm's gamma and beta, or an RMSNorm's gamma (``model.norm``)."""
    spec.gamma = _array(norm.weight)
    if getattr(norm, "bias", None) is not None:
        spec.beta = _array(norm.bias)


def _set_attention(spec, attention, norm: torch.nn.Module, self_attention: bool) -> None:
    """``in_proj`` stacks [W_Q; W_K; W_V]. Self-attention: linear[0] = Q|K|V, linear[1] = W_O;
    cross-attention: linear[0] = Q, linear[1] = K|V, linear[2] = W_O."""
    if self_attention:
        _set_linear(spec.linear[0], attention.in_proj)
    else:
        _set_linear(spec.linear[0], attention.in_proj, slice(0, attention.d_model))
        _set_linear(spec.linear[1], attention.in_proj, slice(attention.d_model, None))
    _set_linear(spec.linear[-1], attention.out_proj)
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec, feed_forward, norm: torch.nn.Module) -> None:
    """linear_0 = W1 (through the non-linearity), linear_1 = W2; a gated layer's linear branch V is linear_0_noact."""
    _set_linear(spec.linear_0, feed_forward.linear1)
    if hasattr(feed_forward, "linear_v"):
        _set_linear(spec.linear_0_noact, feed_forward.linear_v)
    _set_linear(spec.linear_1, feed_forward.linear2)
    _set_layer_norm(spec.layer_norm, norm)


def _set_inputs(spec, embedding: torch.nn.Embedding, positions: torch.nn.Module, form: str, kind: str) -> None:
    """The embeddings, scaled, and the positions in their CTranslate2 ``form`` (``PositionScheme.ctranslate2``)."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(embedding.weight)
    spec.scale_embeddings = True  # * sqrt(d_model)
    if form == "table":  # sinusoidal or learned: the table as the model adds it
        table = getattr(positions, "table", None)
        if not isinstance(table, torch.Tensor):
            raise ValueError(f"model.positions={kind}: its CTranslate2 form is a table, but its module "
                             f"({type(positions).__name__}) has no table attribute to export")
        spec.position_encodings.encodings = _array(table)  # (max_positions, d_model), our interleaved layout
    elif hasattr(spec, "position_encodings"):  # rotary: positions live in the self-attention, not the inputs
        del spec.position_encodings


def transformer_spec(model: Transformer, tokenizer: Tokenizer):
    """Our model as a ``ctranslate2.specs.TransformerSpec`` (weights set, vocabulary registered)."""
    specs = import_ctranslate2().specs
    cfg = model.config
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} pieces but the model {cfg.vocab_size}")
    d_k, d_v = cfg.head_dims()
    if not cfg.n_heads * d_k == cfg.n_heads * d_v == cfg.d_model:
        raise ValueError(f"CTranslate2 needs n_heads x d_k = n_heads x d_v = d_model ({cfg.d_model}); this model has "
                         f"n_heads {cfg.n_heads}, model.d_k {d_k}, model.d_v {d_v}: translate with PyTorch")
    hooked = hooked_modules(model)
    if hooked:
        raise ValueError(f"the model has forward hooks on {', '.join(hooked[:3])}{' ...' if len(hooked) > 3 else ''} "
                         f"(head gates?): an export holds weights only; fold them into the weights first "
                         f"(analysis.head_gates.fold_gates) or remove them")
    positions = form_of("positions", cfg.positions, POSITION_SCHEMES, "ctranslate2")  # each refused, named
    activation = form_of("activation", cfg.activation, ACTIVATIONS, "ctranslate2")
    norm = form_of("norm", cfg.norm, NORMS, "ctranslate2")
    if positions not in ("table", "rotary") or norm not in ("layer_norm", "rms_norm") or not hasattr(
            specs.Activation, activation):
        raise ValueError(f"model.positions={cfg.positions}, model.activation={cfg.activation}, model.norm={cfg.norm}: "
                         f"CTranslate2 forms {positions!r}, {activation!r}, {norm!r}: this exporter writes positions "
                         f"as table or rotary, norms as layer_norm or rms_norm, and activations as members of "
                         f"ctranslate2.specs.Activation")
    if not tokenizer.single_file:
        raise ValueError("CTranslate2 export reads one SentencePiece model whose ids are the model's; this "
                         "tokenizer has separate source and target models or an imported vocabulary: translate "
                         "with PyTorch (engine=native)")
    layout = dict(pre_norm=cfg.norm_first, activation=getattr(specs.Activation, activation),
                  ffn_glu=ACTIVATIONS[cfg.activation].gated, rms_norm=norm == "rms_norm")
    if positions == "rotary":  # every feature of the head, halves paired (positions.RotaryPositions)
        layout.update(rotary_dim=0, rotary_interleave=False, rotary_base=ROTARY_BASE)
    spec = specs.TransformerSpec(specs.TransformerEncoderSpec(cfg.n_encoder_layers, cfg.n_heads, **layout),
                                 specs.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_heads, **layout))
    _set_inputs(spec.encoder, model.src_embed, model.positions, positions, cfg.positions)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.attn_block.norm, self_attention=True)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.ff_block.norm)

    _set_inputs(spec.decoder, model.tgt_embed, model.positions, positions, cfg.positions)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_block.norm, self_attention=True)
        _set_attention(layer_spec.attention, layer.cross_attn, layer.cross_attn_block.norm, self_attention=False)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.ff_block.norm)
    if cfg.norm_first:
        _set_layer_norm(spec.encoder.layer_norm, model.encoder_norm)
        _set_layer_norm(spec.decoder.layer_norm, model.decoder_norm)

    output_weight = model.tgt_embed.weight if model.output_proj is None else model.output_proj.weight
    spec.decoder.projection.weight = _array(output_weight)  # (vocab, d_model)
    bias = np.zeros(cfg.vocab_size, dtype=np.float32) if model.output_bias is None else _array(model.output_bias)
    bias[[cfg.pad_id, tokenizer.bos_id]] = FORBIDDEN_LOGIT_BIAS
    spec.decoder.projection.bias = bias

    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.unk_token = pieces[tokenizer.unk_id]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[tokenizer.bos_id]
    spec.config.eos_token = pieces[tokenizer.eos_id]
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = NORMS[cfg.norm].eps
    return spec


def export_files(directory: Path) -> dict[str, int]:
    """{name: size in bytes} of every file of export ``directory`` but EXPORT_INFO (what EXPORT_INFO lists)."""
    return {path.name: path.stat().st_size for path in sorted(directory.iterdir())
            if path.is_file() and path.name != EXPORT_INFO}


def check_export(directory: str | os.PathLike) -> str | None:
    """What is wrong with export ``directory`` (None: nothing): EXPORT_INFO missing or unreadable, or a file it
    lists missing or of another size (a writer or machine that crashed, a copy cut short). An export written
    before EXPORT_INFO listed its files (format 1) cannot be checked and passes."""
    directory = Path(directory)
    info_path = directory / EXPORT_INFO
    if not info_path.is_file():
        return f"no {EXPORT_INFO}"
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return f"{EXPORT_INFO} is not readable JSON ({error})"
    files = info.get("files") if isinstance(info, dict) else None
    if files is None:
        return None if isinstance(info, dict) else f"{EXPORT_INFO} holds no settings"
    if not isinstance(files, dict):
        return f"{EXPORT_INFO}'s files is not a mapping of names to sizes"
    for name, size in files.items():
        path = directory / str(name)
        if Path(str(name)).name != name or not path.is_file():
            return f"{name}, which {EXPORT_INFO} lists, is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {EXPORT_INFO} records {size}"
    return None


def export_model(model: Transformer, tokenizer: Tokenizer, output: str | os.PathLike, quantization: str = "none",
                 meta: dict | None = None, force: bool = False, exist_ok: bool = False) -> Path:
    """Write ``model`` as a CTranslate2 model directory ``output``; returns its path.

    The directory is written under a fresh temporary name (``mkdtemp``), fsynced and renamed into place, so
    ``output`` is either absent or complete. ``meta`` (as from ``load_checkpoint``) records where the model
    came from. ``force``: replace an existing ``output``. ``exist_ok``: keep an ``output`` that another process
    completed meanwhile (the cache, where the same key is the same export) and discard this one."""
    ctranslate2 = import_ctranslate2()
    weight_type = check_quantization(quantization)
    output = Path(output)
    if output.exists() and not (force or exist_ok):
        raise SystemExit(f"output={output} already exists; choose another directory or give force=true")
    spec = transformer_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=weight_type)
    tmp = temporary_directory(output)  # this process's alone: no other writer has its name
    try:
        spec.save(str(tmp))
        tokenizer.save(tmp / SENTENCEPIECE_MODEL)
        meta = meta or {}
        info = {"model_config": model.config.to_dict(), "data_config": meta.get("data_config"),
                "checkpoint": meta.get("path"), "global_step": meta.get("global_step"),
                "quantization": quantization or "none", "ctranslate2_version": ctranslate2.__version__,
                "version": __version__, "files": export_files(tmp)}
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        if force and (output.exists() or output.is_symlink()):
            check_replaceable(output, tmp)
            replace_directory(tmp, output)  # the old export goes once the new one has its name
            return output
        try:
            publish_directory(tmp, output)  # atomic; fails when output is a directory that is not empty
        except OSError:
            if not exist_ok:
                raise
            if check_export(output) is not None:
                replace_broken(output, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output


def replace_broken(output: Path, export: Path) -> None:
    """Put the complete ``export`` where ``output``, a directory ``check_export`` refuses (an export that never
    finished, or whose files a crash cut short), stands; no reader uses such a directory. Under a lock, so that
    a racing process's complete export is never moved aside; one completed meanwhile is kept."""
    with FileLock(f"{output}.lock"):
        if check_export(output) is None:
            return
        stale = Path(tempfile.mkdtemp(prefix=f"{output.name}.broken-", dir=output.parent))  # empty: replaceable
        try:
            if output.exists():
                os.replace(output, stale)
            os.replace(export, output)
            fsync_directory(output.parent)
        finally:
            shutil.rmtree(stale, ignore_errors=True)


def cached_export(ckpt: str | os.PathLike) -> Path:
    """The float32 CTranslate2 export of checkpoint ``ckpt``, written on first use to
    ``$XDG_CACHE_HOME/transformer_nmt/ctranslate2/`` (default ``~/.cache/...``) under the sha256 of the checkpoint's
    bytes (``file_digest.content_digest``: hashed once per version of the file, memoized by its identity), so that a
    checkpoint replaced by another one with the same path, size and modification time (``cp -p``, ``rsync -a``, an
    image with normalised times) is exported anew, never decoded with the old export; copies of one checkpoint
    share an entry. Every use checks the entry (``check_export``: each file at the size the export recorded); one
    that fails is exported again and replaced (``replace_broken``). Concurrent first uses (two ``translate``
    processes) each write their own temporary export; the first rename wins and the others keep it: a complete
    entry, once there, is never removed or replaced under a reader."""
    path = Path(ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    digest = content_digest(path)
    output = user_cache() / "ctranslate2" / f"{digest[:32]}-v{EXPORT_FORMAT}"
    problem = check_export(output)
    if problem is not None:
        if output.exists():
            print(f"warning: the cached export {output} is incomplete ({problem}): exporting {path} again",
                  file=sys.stderr)
        model, tokenizer, meta = load_checkpoint(path)
        export_model(model, tokenizer, output, meta=meta, exist_ok=True)
    return output


def export_command(options: ExportOptions) -> Path:
    """``python -m transformer_nmt.export format=ctranslate2`` (the command, transformer_nmt/export.py, picks the
    format): ``options.ckpt`` exported to ``options.output``."""
    check_quantization(options.quantization)  # before the (slow) checkpoint load
    model, tokenizer, meta = load_checkpoint(options.ckpt)
    output = export_model(model, tokenizer, options.output, options.quantization, meta, options.force)
    print(f"exported {options.ckpt} -> {output} (quantization {options.quantization})")
    return output
