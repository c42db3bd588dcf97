"""Our checkpoints as transformers' MarianMTModel directories, and MarianMT directories as our checkpoints, exactly.

    python -m transformer_nmt.export ckpt=RUN/averaged.ckpt format=marian output=DIR
    python -m transformer_nmt.import_marian input=DIR output=model.ckpt

A MarianMT directory (the format of the opus-mt models) holds ``config.json``, ``model.safetensors``,
``generation_config.json``, ``source.spm`` and ``target.spm`` (SentencePiece models), ``vocab.json`` (the joint
vocabulary: piece -> id) and ``tokenizer_config.json``; ``MarianMTModel.from_pretrained(DIR)`` and
``MarianTokenizer.from_pretrained(DIR)`` read it with no code of ours. The two architectures are the same
network (post-LN encoder-decoder, sinusoidal positions, embeddings scaled by sqrt(d_model)); where they differ:

- positions: our table interleaves sin and cos (PE[:, 2i] = sin, PE[:, 2i+1] = cos), transformers' puts every
  sine before every cosine (``MarianSinusoidalPositionalEmbedding``). Permuting the model dimension the same way
  in every weight (``model_dim_order``) is an exact symmetry of the network: each linear map that reads the
  residual stream gets its columns permuted, each that writes it its rows, and LayerNorm (whose mean and
  variance do not depend on the order) its weight and bias. So the exported weights are ours, permuted, and the
  import permutes them back: a round trip gives the same tensors, bit for bit.
- special tokens: ours are pad 0, unk 1, bos 2, eos 3, and the decoder starts from bos; MarianMT's ids come from
  its config (opus-mt: eos 0, unk 1, pad last) and its decoder starts from ``decoder_start_token_id`` (opus-mt:
  pad). The export keeps our ids and sets ``decoder_start_token_id`` to bos; the import reorders the vocabulary
  to pad, unk, decoder start, eos, then the rest in MarianMT's order, and where the decoder starts from pad gives
  bos a copy of pad's row (one more id, never an output).
- pad and bos are never outputs: our decoding gives them probability 0 and renormalises over the rest; the
  generation config suppresses them (``suppress_tokens``) and renormalises (``renormalize_logits``), which is
  the same distribution, so greedy search and beam search see the same scores.
- the logits bias: ``final_logits_bias`` is our ``model.output_bias`` (zeros where we have none; an all-zero
  one imports as none).
- refused, with the reason: positions other than sinusoidal (learned, Table 3 row E; rotary; none), pre-LN and
  RMSNorm (MarianMTModel has none of them), d_k x h or d_v x h other than d_model (row B: MarianMTModel's heads
  are d_model / h wide), an activation other than relu, swish and gelu (the gated swiglu and geglu), unscaled
  embeddings, encoder and decoder of other widths, heads or feed-forward sizes, separate source and target
  vocabularies. Each position scheme, activation and norm states its Marian form, or that it has none, where it
  is registered (``marian=`` of its PositionScheme, Activation, Norm: model/export_forms.py); one that states
  nothing is refused too, naming the option.
- not convertible, so documented: beam search's length penalty. Ours is GNMT's ((5 + |Y|) / 6) ** alpha,
  transformers' |Y| ** length_penalty; they agree at alpha = 0 (tests/test_marian.py proves beam output
  identical there). The exported ``generation_config.json`` asks for beam 4 with ``length_penalty`` alpha.

transformers and safetensors (``pip install -e ".[hf]"``) are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from transformer_nmt.data.language_tags import LanguageTags
from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from transformer_nmt.durable import publish_directory, replace_directory, temporary_directory
from transformer_nmt.model.export_forms import form_of
from transformer_nmt.model.feed_forward import ACTIVATIONS
from transformer_nmt.model.hooks import hooked_modules
from transformer_nmt.model.norms import NORMS
from transformer_nmt.model.positions import POSITION_SCHEMES
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.options import command_argv, option, parse_options

CONFIG, WEIGHTS, GENERATION_CONFIG = "config.json", "model.safetensors", "generation_config.json"
SOURCE_SPM, TARGET_SPM, VOCAB, TOKENIZER_CONFIG = "source.spm", "target.spm", "vocab.json", "tokenizer_config.json"
MODEL_CARD = "README.md"
# transformers' activation_function -> our model.activation: each activation's stated Marian form (feed_forward.py),
# and transformers' "silu", which is swish too
FROM_MARIAN_ACTIVATION = {**{a.marian: name for name, a in ACTIVATIONS.items() if isinstance(a.marian, str)},
                          "silu": "swish"}
BOS_PIECES = ("<s>", "<bos>", "<decoder_start>")  # the name of an imported model's new bos id: the first free one
IMPORTED = "imported_from"  # checkpoint key: where an imported checkpoint came from


class ConversionError(ValueError):
    """A model that cannot be converted exactly; the message says why."""


def import_transformers():
    """The transformers module, or an error that says how to install it."""
    try:
        import transformers
    except ImportError:
        raise SystemExit('transformers is not installed: pip install -e ".[hf]" (transformers, safetensors, '
                         'huggingface_hub)') from None
    return transformers


def model_dim_order(d_model: int) -> torch.Tensor:
    """(d_model,) indices: MarianMT's dimension k is our dimension order[k] (our sines, then our cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# ------------------------------------------------------------------------------------------------ the layout


def layer_pairs(n_encoder_layers: int, n_decoder_layers: int) -> list[tuple[str, str, str]]:
    """(our module, MarianMT's module, kind) for every layer's parts; kind: attention, norm, ffn_in, ffn_out."""
    pairs = []
    for i in range(n_encoder_layers):
        ours, theirs = f"encoder_layers.{i}.", f"model.encoder.layers.{i}."
        pairs += [(ours + "self_attn", theirs + "self_attn", "attention"),
                  (ours + "attn_block.norm", theirs + "self_attn_layer_norm", "norm"),
                  (ours + "feed_forward.linear1", theirs + "fc1", "ffn_in"),
                  (ours + "feed_forward.linear2", theirs + "fc2", "ffn_out"),
                  (ours + "ff_block.norm", theirs + "final_layer_norm", "norm")]
    for i in range(n_decoder_layers):
        ours, theirs = f"decoder_layers.{i}.", f"model.decoder.layers.{i}."
        pairs += [(ours + "self_attn", theirs + "self_attn", "attention"),
                  (ours + "self_attn_block.norm", theirs + "self_attn_layer_norm", "norm"),
                  (ours + "cross_attn", theirs + "encoder_attn", "attention"),
                  (ours + "cross_attn_block.norm", theirs + "encoder_attn_layer_norm", "norm"),
                  (ours + "feed_forward.linear1", theirs + "fc1", "ffn_in"),
                  (ours + "feed_forward.linear2", theirs + "fc2", "ffn_out"),
                  (ours + "ff_block.norm", theirs + "final_layer_norm", "norm")]
    return pairs


def check_exportable(config: TransformerConfig, tokenizer: Tokenizer) -> None:
    """Raise ConversionError naming what MarianMTModel cannot hold exactly."""
    d_k, d_v = config.head_dims()
    marian_forms(config)
    if config.norm_first:
        raise ConversionError("model.norm_first=true: MarianMTModel is post-LN only")
    if not config.n_heads * d_k == config.n_heads * d_v == config.d_model:
        raise ConversionError(f"n_heads x d_k = {config.n_heads * d_k}, n_heads x d_v = {config.n_heads * d_v}: "
                              f"MarianMTModel's heads are d_model / n_heads = {config.d_model / config.n_heads} "
                              f"wide (Table 3, row B cannot be exported)")
    if tokenizer.vocab_size != config.vocab_size:
        raise ConversionError(f"tokenizer has {tokenizer.vocab_size} pieces but the model {config.vocab_size}")


def marian_forms(config: TransformerConfig) -> dict[str, str]:
    """{positions, activation, norm: the Marian form each registration states (model/export_forms.py)}; a
    ConversionError naming the option where one states none, or one this converter does not write."""
    known = {"positions": ("sinusoidal",), "norm": ("layer_norm",)}  # the activation: transformers' name, any
    forms = {}
    for key, registry in (("positions", POSITION_SCHEMES), ("activation", ACTIVATIONS), ("norm", NORMS)):
        try:
            forms[key] = form_of(key, getattr(config, key), registry, "marian")
        except ValueError as error:
            raise ConversionError(str(error)) from None
        if key in known and forms[key] not in known[key]:
            raise ConversionError(f"model.{key}={getattr(config, key)}: Marian form {forms[key]!r}; this converter "
                                  f"writes {', '.join(known[key])}")
    return forms


def to_marian_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under MarianMTModel's names and layout (the model dimension permuted). Positions are not
    weights on either side."""
    cfg = model.config
    hooked = hooked_modules(model)
    if hooked:
        raise ConversionError(f"the model has forward hooks on {', '.join(hooked[:3])} (head gates?): an export holds "
                              f"weights only; fold them into the weights first (analysis.head_gates.fold_gates)")
    order = model_dim_order(cfg.d_model)
    state = {name: tensor.detach().to("cpu", torch.float32) for name, tensor in model.state_dict().items()}
    out = {}
    for ours, theirs, kind in layer_pairs(cfg.n_encoder_layers, cfg.n_decoder_layers):
        if kind == "attention":
            weights = state[f"{ours}.in_proj.weight"].split(cfg.d_model)  # W_Q, W_K, W_V: (d_model, d_model)
            biases = state[f"{ours}.in_proj.bias"].split(cfg.d_model)
            for proj, weight, bias in zip("qkv", weights, biases):
                out[f"{theirs}.{proj}_proj.weight"], out[f"{theirs}.{proj}_proj.bias"] = weight[:, order], bias
            out[f"{theirs}.out_proj.weight"] = state[f"{ours}.out_proj.weight"][order]
            out[f"{theirs}.out_proj.bias"] = state[f"{ours}.out_proj.bias"][order]
        elif kind == "ffn_in":  # reads the residual stream: columns
            out[f"{theirs}.weight"], out[f"{theirs}.bias"] = state[f"{ours}.weight"][:, order], state[f"{ours}.bias"]
        else:  # norm, ffn_out: write it (rows, and the bias)
            out[f"{theirs}.weight"], out[f"{theirs}.bias"] = (state[f"{ours}.weight"][order],
                                                              state[f"{ours}.bias"][order])
    source, target = state["src_embed.weight"][:, order], state["tgt_embed.weight"][:, order]  # (vocab, d_model)
    output = target if cfg.tie_embeddings else state["output_proj.weight"][:, order]
    if cfg.tie_embeddings:
        out["model.shared.weight"] = source
    out.update({"model.encoder.embed_tokens.weight": source, "model.decoder.embed_tokens.weight": target,
                "lm_head.weight": output})
    bias = state.get("output_bias", torch.zeros(cfg.vocab_size))
    out["final_logits_bias"] = bias.reshape(1, -1)  # (1, vocab)
    return out


def marian_config(config: TransformerConfig, tokenizer: Tokenizer) -> dict:
    """MarianConfig's arguments for ``config`` (our special ids; the decoder starts from bos)."""
    return {
        "vocab_size": config.vocab_size, "decoder_vocab_size": config.vocab_size, "d_model": config.d_model,
        "encoder_layers": config.n_encoder_layers, "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads, "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "activation_function": marian_forms(config)["activation"], "dropout": config.dropout,
        "attention_dropout": config.attention_dropout, "activation_dropout": 0.0,
        "max_position_embeddings": config.max_positions, "scale_embedding": True,
        "share_encoder_decoder_embeddings": config.tie_embeddings, "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": tokenizer.pad_id, "eos_token_id": tokenizer.eos_id, "bos_token_id": tokenizer.bos_id,
        "decoder_start_token_id": tokenizer.bos_id, "forced_eos_token_id": None,
        "architectures": ["MarianMTModel"],
    }


def generation_config(config: TransformerConfig, tokenizer: Tokenizer, beam: int, alpha: float) -> dict:
    """GenerationConfig's arguments: decode as ours does (see the module's docstring)."""
    return {"decoder_start_token_id": tokenizer.bos_id, "bos_token_id": tokenizer.bos_id,
            "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id, "forced_eos_token_id": None,
            "suppress_tokens": [tokenizer.pad_id, tokenizer.bos_id], "renormalize_logits": True,
            "num_beams": beam, "length_penalty": alpha, "max_length": config.max_positions,
            "early_stopping": "never" if beam > 1 else None}


# ------------------------------------------------------------------------------------------------ export


def export_marian(model: Transformer, tokenizer: Tokenizer, output: str | os.PathLike, meta: dict | None = None,
                  force: bool = False, command: str | None = None) -> Path:
    """Write ``model`` as a MarianMT directory ``output`` (under a fresh temporary name beside it, fsynced, then
    renamed into place; ``force``: replacing an earlier export, and nothing else, once the new one is complete:
    export.check_replaceable, durable.replace_directory). ``meta`` (as ``load_checkpoint`` gives it) and
    ``command`` go into the model card."""
    from transformer_nmt.durable import check_replaceable
    from transformer_nmt.generation.config import DecodeConfig

    transformers = import_transformers()
    check_exportable(model.config, tokenizer)
    output = Path(output)
    if output.exists() and not force:
        raise SystemExit(f"output={output} already exists; choose another directory or give force=true")
    meta = meta or {}
    data = meta.get("data_config") or {}
    hf_config = transformers.MarianConfig(**marian_config(model.config, tokenizer))
    hf_model = transformers.MarianMTModel(hf_config)
    weights = to_marian_weights(model)
    expected = set(hf_model.state_dict())
    missing = sorted(expected - set(weights) - {k for k in expected if k.endswith("embed_positions.weight")})
    unexpected = sorted(set(weights) - expected)
    if missing or unexpected:
        raise ConversionError(f"MarianMTModel's weights do not match the conversion's: missing {missing}, "
                              f"unexpected {unexpected} (transformers {transformers.__version__})")
    hf_model.load_state_dict(weights, strict=False)
    decode = DecodeConfig()
    hf_model.generation_config = transformers.GenerationConfig(
        **generation_config(model.config, tokenizer, decode.beam, decode.alpha))
    tmp = temporary_directory(output)  # this process's alone (mkdtemp beside output)
    try:
        hf_model.save_pretrained(tmp)
        pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
        (tmp / SOURCE_SPM).write_bytes(tokenizer.model_proto)
        (tmp / TARGET_SPM).write_bytes(tokenizer.target_proto or tokenizer.model_proto)
        (tmp / VOCAB).write_text(json.dumps({piece: i for i, piece in enumerate(pieces)}, ensure_ascii=False,
                                            indent=0) + "\n", encoding="utf-8")
        hf_tokenizer = transformers.MarianTokenizer(
            str(tmp / SOURCE_SPM), str(tmp / TARGET_SPM), str(tmp / VOCAB), source_lang=data.get("src_lang"),
            target_lang=data.get("tgt_lang"), unk_token=pieces[UNK_ID], eos_token=pieces[EOS_ID],
            pad_token=pieces[PAD_ID], model_max_length=model.config.max_positions)
        tags = LanguageTags.of(data)
        if tags is not None:  # kept whole, at their ids in vocab.json: "<2fr> text" reads as Direction.encode's ids
            hf_tokenizer.add_special_tokens({"additional_special_tokens": tags.pieces()})
            check_tags_whole(hf_tokenizer, tokenizer, tags.pieces())
        hf_tokenizer.save_pretrained(tmp)
        (tmp / MODEL_CARD).write_text(model_card(model.config, meta, command), encoding="utf-8")
        if force and (output.exists() or output.is_symlink()):
            check_replaceable(output, tmp)  # an earlier export only, never a run dir
            replace_directory(tmp, output)  # the old export goes once the new one has its name
        else:
            publish_directory(tmp, output)  # fsynced, then renamed into place
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output


def check_tags_whole(hf_tokenizer, tokenizer, pieces: list[str]) -> None:
    """A ``ConversionError`` where the exported tokenizer does not read a language tag as the one id ours has."""
    for piece in pieces:
        got = hf_tokenizer(piece, add_special_tokens=False)["input_ids"]
        if got != [tokenizer.piece_id(piece)]:
            raise ConversionError(f"MarianTokenizer reads the language tag {piece!r} as {got}, not as its one id "
                                  f"{tokenizer.piece_id(piece)}: the export would tag sources otherwise than we do")


def _scores(meta: dict) -> list[str]:
    """Markdown lines for the measured scores beside the checkpoint: the run's results.json (greedy BLEU of
    training's validation and test) and evaluate's JSON files of this checkpoint (eval/*.json)."""
    path = Path(meta["path"]) if meta.get("path") else None
    if path is None:
        return []
    lines = []
    for run_dir in (path.parent, path.parent.parent):
        results = run_dir / "results.json"
        if results.is_file():
            record = _json(results)
            shown = {k: record.get(k) for k in ("val_bleu", "test_bleu", "steps", "wall_seconds", "precision")}
            lines.append(f"- training run `{run_dir.name}` (results.json; greedy, sacreBLEU defaults): "
                         + ", ".join(f"{k} {v}" for k, v in shown.items() if isinstance(v, (int, float, str))))
            break
    for file in sorted((path.parent / "eval").glob("*.json")):
        record = _json(file)
        if Path(str(record.get("checkpoint", ""))).name != path.name:
            continue  # another checkpoint's scores
        numbers = {k: record.get(k) for k in ("sentences", "beam", "alpha", "bleu", "chrf")}
        if not all(isinstance(v, (int, float)) for v in numbers.values()):
            continue
        lines.append(f"- `{file.stem}` ({numbers['sentences']} sentences, beam {numbers['beam']}, alpha "
                     f"{numbers['alpha']}): BLEU {numbers['bleu']} (`{record.get('bleu_signature')}`), chrF "
                     f"{numbers['chrf']} (`{record.get('chrf_signature')}`)")
    return lines


def _json(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def model_card(config: TransformerConfig, meta: dict, command: str | None) -> str:
    """The directory's README.md: what the model is, how it was trained and scored, and how it was made."""
    data = meta.get("data_config") or {}
    src, tgt = data.get("src_lang", "src"), data.get("tgt_lang", "tgt")
    scores = _scores(meta) or ["- none recorded beside the checkpoint (python -m transformer_nmt.evaluate writes "
                               "them to eval/)"]
    data_lines = [f"- {key}: `{data[key]}`" for key in ("format", "train", "val", "test", "hub_name", "vocab_size",
                                                         "spm_model_type", "max_positions")
                  if data.get(key) is not None]
    model = config.to_dict()
    return "\n".join([
        "---", "tags:", "- translation", "- marian", "- transformer_nmt", "language:", f"- {src}", f"- {tgt}",
        "pipeline_tag: translation", "---", "",
        f"# {src}->{tgt} Transformer (transformer_nmt)", "",
        "An encoder-decoder Transformer trained with transformer_nmt and exported to MarianMT's format: load it "
        "with `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` (with transformers 4 also "
        "`pipeline(\"translation\", model=DIR)`). Greedy search translates exactly as transformer_nmt does; beam "
        "search differs in its length penalty only (transformers' |Y|^alpha against GNMT's ((5+|Y|)/6)^alpha).", "",
        "## Scores", "", *scores, "",
        "## Data", "", *(data_lines or ["- not recorded in the checkpoint"]), "",
        "## Model", "", "```json", json.dumps(model, indent=2), "```", "",
        "## Training", "", f"- checkpoint: `{meta.get('path')}`, step {meta.get('global_step')}",
        "```json", json.dumps(meta.get("hyper_parameters") or {}, indent=2, default=str), "```", "",
        "## Made with", "", f"```\n{command or 'python -m transformer_nmt.export format=marian'}\n```", ""])


# ------------------------------------------------------------------------------------------------ import


def _refuse(directory: Path, reason: str) -> ConversionError:
    return ConversionError(f"{directory}: {reason}")


def read_marian_tokenizer(directory: Path, hf_config) -> tuple[dict[str, int], bytes, bytes, dict]:
    """(vocab piece -> MarianMT id, source and target SentencePiece models, tokenizer_config), checked."""
    for name in (VOCAB, SOURCE_SPM, TARGET_SPM):
        if not (directory / name).is_file():
            raise _refuse(directory, f"no {name} (a MarianMT directory holds {VOCAB}, {SOURCE_SPM}, {TARGET_SPM})")
    settings = _json(directory / TOKENIZER_CONFIG) if (directory / TOKENIZER_CONFIG).is_file() else {}
    if settings.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
        raise _refuse(directory, "separate source and target vocabularies (separate_vocabs): our model has one "
                                 "joint vocabulary")
    try:
        vocab = json.loads((directory / VOCAB).read_text(encoding="utf-8"))
    except ValueError as error:
        raise _refuse(directory, f"{VOCAB} is not JSON: {error}") from None
    if not isinstance(vocab, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in vocab.items()):
        raise _refuse(directory, f"{VOCAB} must map pieces (strings) to ids (integers)")
    if sorted(vocab.values()) != list(range(hf_config.vocab_size)):
        raise _refuse(directory, f"{VOCAB} has {len(vocab)} pieces with ids that are not 0..{hf_config.vocab_size - 1}"
                                 f" once each (config.json vocab_size {hf_config.vocab_size})")
    return vocab, (directory / SOURCE_SPM).read_bytes(), (directory / TARGET_SPM).read_bytes(), settings


def check_importable(directory: Path, hf_config) -> str:
    """Raise ConversionError naming what our Transformer cannot compute exactly; returns our activation."""
    c = hf_config
    if getattr(c, "model_type", None) != "marian":
        raise _refuse(directory, f"{CONFIG} has model_type {getattr(c, 'model_type', None)!r}, not 'marian'")
    activation = FROM_MARIAN_ACTIVATION.get(c.activation_function)
    if activation is None:
        raise _refuse(directory, f"activation_function {c.activation_function!r}: ours are "
                                 f"{sorted(FROM_MARIAN_ACTIVATION)}")
    if not c.scale_embedding:
        raise _refuse(directory, "scale_embedding false: our model scales its embeddings by sqrt(d_model)")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if getattr(c, a) != getattr(c, b):
            raise _refuse(directory, f"{a} {getattr(c, a)} != {b} {getattr(c, b)}: our encoder and decoder share "
                                     f"n_heads and d_ff")
    if (c.decoder_vocab_size or c.vocab_size) != c.vocab_size:
        raise _refuse(directory, f"decoder_vocab_size {c.decoder_vocab_size} != vocab_size {c.vocab_size}: our "
                                 f"model has one joint vocabulary")
    return activation


def vocabulary_order(directory: Path, vocab: dict[str, int], settings: dict, pad: int, eos: int, start: int
                     ) -> tuple[list[int], list[str]]:
    """(MarianMT id of each of our ids, our pieces): pad, unk, the decoder's start (our bos), eos, then the rest in
    MarianMT's order. Where the decoder starts from pad, bos is a new id with pad's row, named BOS_PIECES[0] (or
    the first name not in the vocabulary)."""
    piece_of = {i: piece for piece, i in vocab.items()}
    unk_piece = settings.get("unk_token", "<unk>")
    unk_piece = unk_piece.get("content") if isinstance(unk_piece, dict) else unk_piece
    if unk_piece not in vocab:
        raise _refuse(directory, f"the unknown token {unk_piece!r} is not in {VOCAB}")
    unk = vocab[unk_piece]
    if len({pad, unk, eos}) != 3 or start in (unk, eos):
        raise _refuse(directory, f"pad {pad}, unk {unk}, eos {eos} and decoder start {start} ids must be distinct "
                                 f"(the start may be pad)")
    order = [pad, unk, start, eos] + [i for i in range(len(vocab)) if i not in (pad, unk, start, eos)]
    pieces = [piece_of[i] for i in order]
    if start == pad:
        pieces[BOS_ID] = next(name for name in BOS_PIECES if name not in vocab)
    return order, pieces


def import_marian(directory: str | os.PathLike) -> tuple[Transformer, Tokenizer, dict]:
    """A MarianMT directory -> (our Transformer in eval mode, its Tokenizer, what was imported). Refuses what it
    cannot compute exactly (ConversionError naming it); the weights are read as data (safetensors, or
    ``torch.load(weights_only=True)`` of pytorch_model.bin, through transformers)."""
    transformers = import_transformers()
    directory = Path(directory)
    if not (directory / CONFIG).is_file():
        raise SystemExit(f"input={directory} is not a MarianMT directory: it has no {CONFIG}")
    model_type = _json(directory / CONFIG).get("model_type")
    if model_type != "marian":
        raise _refuse(directory, f"{CONFIG} has model_type {model_type!r}, not 'marian'")
    hf_config = transformers.MarianConfig.from_pretrained(directory)
    activation = check_importable(directory, hf_config)
    vocab, source_spm, target_spm, settings = read_marian_tokenizer(directory, hf_config)
    hf_model = transformers.MarianMTModel.from_pretrained(directory, dtype=torch.float32).eval()
    start = hf_model.generation_config.decoder_start_token_id
    start = hf_config.decoder_start_token_id if start is None else start
    eos = hf_config.eos_token_id[0] if isinstance(hf_config.eos_token_id, list) else hf_config.eos_token_id
    order, pieces = vocabulary_order(directory, vocab, settings, hf_config.pad_token_id, eos, start)

    c = hf_config
    tied = bool(c.share_encoder_decoder_embeddings and c.tie_word_embeddings)
    state = {name: tensor.detach().float() for name, tensor in hf_model.state_dict().items()}
    bias = state["final_logits_bias"].reshape(-1)[order]  # (our vocab,)
    config = TransformerConfig(
        vocab_size=len(order), d_model=c.d_model, n_heads=c.encoder_attention_heads,
        n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers, d_ff=c.encoder_ffn_dim,
        dropout=float(c.dropout), attention_dropout=float(c.attention_dropout),
        max_positions=c.max_position_embeddings, tie_embeddings=tied, activation=activation,
        output_bias=bool(bias.any()))
    ours = from_marian_weights(state, config, order, bias)
    model = Transformer(config)
    model.load_state_dict(ours)
    tokenizer = imported_tokenizer(source_spm, target_spm, pieces)
    info = {"format": "marian", "directory": str(directory.resolve()), "transformers": transformers.__version__,
            "marian_ids_of_ours": order[:4], "added_bos": start == hf_config.pad_token_id,
            "activation_dropout_ignored": float(c.activation_dropout)}
    return model.eval(), tokenizer, info


def from_marian_weights(state: dict[str, torch.Tensor], config: TransformerConfig, order: list[int],
                        bias: torch.Tensor) -> dict[str, torch.Tensor]:
    """MarianMTModel's weights (``state``) as our state dict for ``config``, the vocabulary in our ``order``."""
    back = torch.argsort(model_dim_order(config.d_model))  # our dimension j is MarianMT's back[j]
    ours = {}
    for mine, theirs, kind in layer_pairs(config.n_encoder_layers, config.n_decoder_layers):
        if kind == "attention":
            ours[f"{mine}.in_proj.weight"] = torch.cat([state[f"{theirs}.{p}_proj.weight"][:, back] for p in "qkv"])
            ours[f"{mine}.in_proj.bias"] = torch.cat([state[f"{theirs}.{p}_proj.bias"] for p in "qkv"])
            ours[f"{mine}.out_proj.weight"] = state[f"{theirs}.out_proj.weight"][back]
            ours[f"{mine}.out_proj.bias"] = state[f"{theirs}.out_proj.bias"][back]
        elif kind == "ffn_in":
            ours[f"{mine}.weight"], ours[f"{mine}.bias"] = state[f"{theirs}.weight"][:, back], state[f"{theirs}.bias"]
        else:
            ours[f"{mine}.weight"], ours[f"{mine}.bias"] = (state[f"{theirs}.weight"][back],
                                                            state[f"{theirs}.bias"][back])

    def rows(name: str) -> torch.Tensor:  # (MarianMT vocab, d_model) -> (our vocab, d_model), our layout
        return state[name][order][:, back].contiguous()

    ours["src_embed.weight"] = rows("model.encoder.embed_tokens.weight")
    ours["tgt_embed.weight"] = ours["src_embed.weight"] if config.tie_embeddings else rows(
        "model.decoder.embed_tokens.weight")
    if not config.tie_embeddings:
        ours["output_proj.weight"] = rows("lm_head.weight")
    if config.output_bias:
        ours["output_bias"] = bias.contiguous()
    return ours


def imported_tokenizer(source_spm: bytes, target_spm: bytes, pieces: list[str]) -> Tokenizer:
    """Our Tokenizer over the imported files: a single SentencePiece model where the two are one file whose own ids
    and specials are ``pieces`` (a round trip of our export), else the models and the joint vocabulary."""
    if source_spm == target_spm:
        plain = None
        try:
            plain = Tokenizer(source_spm)
        except ValueError:  # other special ids than ours
            pass
        if plain is not None and [plain.id_to_piece(i) for i in range(plain.vocab_size)] == pieces:
            return plain
    return Tokenizer(source_spm, None if target_spm == source_spm else target_spm, pieces)


def imported_checkpoint(model: Transformer, tokenizer: Tokenizer, info: dict) -> dict:
    """A checkpoint dict for an imported model: what ``load_checkpoint`` reads (no optimizer state)."""
    from transformer_nmt.checkpoint import CKPT_MODEL_CONFIG, MODEL_PREFIX, tokenizer_entries

    return {"state_dict": {MODEL_PREFIX + name: tensor for name, tensor in model.state_dict().items()},
            CKPT_MODEL_CONFIG: model.config.to_dict(), **tokenizer_entries(tokenizer),
            "global_step": 0, "epoch": 0, IMPORTED: info}


# ------------------------------------------------------------------------------------------------ the command

IMPORT_USAGE = "python -m transformer_nmt.import_marian input=DIR output=model.ckpt [force=true]"


@dataclass
class ImportOptions:
    input: Optional[str] = option(None, "a MarianMT directory (config.json, model.safetensors or pytorch_model.bin, "
                                        "source.spm, target.spm, vocab.json), e.g. a downloaded opus-mt model")
    output: Optional[str] = option(None, "the checkpoint to write (translate, evaluate, analyze_heads, explore and "
                                         "train's init_from read it)")
    force: bool = option(False, "replace output if it exists")


OPTIONS = ImportOptions  # import_marian's: what test_docs checks the docs' commands against


def import_main(argv: list[str] | None = None) -> Path:
    """``python -m transformer_nmt.import_marian``: a MarianMT directory -> our checkpoint."""
    from transformer_nmt.checkpoint import atomic_torch_save

    options = parse_options(command_argv(argv), ImportOptions, __doc__, IMPORT_USAGE)
    if not options.input or not options.output:
        raise SystemExit(f"give input=DIR and output=PATH ({IMPORT_USAGE})")
    output = Path(options.output)
    if output.exists() and not options.force:
        raise SystemExit(f"output={output} already exists; choose another path or give force=true")
    try:
        model, tokenizer, info = import_marian(options.input)
    except ConversionError as error:
        raise SystemExit(f"cannot import exactly: {error}") from None
    atomic_torch_save(imported_checkpoint(model, tokenizer, info), output)
    c = model.config
    print(f"imported {options.input} -> {output} ({model.num_parameters():,} parameters, layers "
          f"{c.n_encoder_layers}+{c.n_decoder_layers}, d_model {c.d_model}, {c.activation}, vocabulary "
          f"{c.vocab_size}{', bos added' if info['added_bos'] else ''})")
    return output
