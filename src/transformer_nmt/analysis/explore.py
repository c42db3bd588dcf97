"""The attention explorer: translate your own sentences and write one self-contained HTML page in which
to move through every layer and head of the encoder self-attention, decoder self-attention and
cross-attention (after bertviz's head and model views, with no network at view time).

    python -m transformer_nmt.explore ckpt=RUN/averaged.ckpt "A dog runs on the beach." "Two men talk."
    python -m transformer_nmt.explore ckpt=model.ckpt input=sentences.en output=attention.html beam=1
    python -m transformer_nmt.explore ckpt=model.ckpt prune=0.3 "A dog runs."   # 30% of heads gated off

Every argument that is not ``key=value`` (without spaces) is a sentence. Options: ``input`` (a file, one
sentence a line, instead of or after the arguments), ``output`` (the page; default ``attention.html``),
``beam``/``alpha``/``max_len_offset`` and ``src_lang``/``tgt_lang``/``zero_shot`` (a model of several pairs; as
translate), ``device``, and ``prune`` (a fraction of heads to
gate off, least important first, read from ``importance``: the ``head_importance.csv`` that
``python -m transformer_nmt.analyze_heads`` wrote for this checkpoint, by default in ``heads/`` beside it).

The decoder is teacher-forced with its own translation: its queries are the decoder's inputs, ``<s>``
and the translation's pieces. In Python, ``attention(model, tokenizer, sentences)`` gives the same data
(float weights); ``write_page`` turns it into the page. Page encoding: one JSON object in a
``<script type="application/json">`` tag; each (sentence, kind) holds its weights as uint8
(round(255 x weight)), row-major over (layer, head, query, key), base64-encoded; entropies are floats.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from transformer_nmt.analysis.head_gates import gates, set_gates
from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.language_tags import Direction
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.config import DecodeConfig, SearchConfig, decode_settings
from transformer_nmt.inference.attention_maps import ATTENTION_KINDS, attention_entropy
from transformer_nmt.inference.attention_weights import teacher_forced_attention
from transformer_nmt.inference.directions import DirectionOptions, direction_of
from transformer_nmt.inference.translate import encode_sources, read_lines, translate_ids
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.options import (
    HELP_FLAGS,
    command_argv,
    option,
    option_of,
    parse_options,
    require_checkpoint,
    values_of,
)

USAGE = 'python -m transformer_nmt.explore ckpt=PATH [key=value ...] ["A sentence." ...]'


@dataclass
class ExploreOptions(SearchConfig):
    """The search's settings (SearchConfig: the translation explored is searched natively), and the page's."""

    ckpt: Optional[str] = option(None, "a checkpoint written by python -m transformer_nmt.train")
    input: Optional[str] = option(None, "a file of sentences, one a line, explored after those given as arguments")
    output: str = option("attention.html", "the page to write")
    prune: float = option(0.0, "the fraction of heads to gate off, least important first (0 to 1)")
    importance: Optional[str] = option(None, "with prune=: the head_importance.csv of analyze_heads; null: "
                                             "heads/head_importance.csv beside the checkpoint")
    src_lang: Optional[str] = option_of(DirectionOptions, "src_lang")
    tgt_lang: Optional[str] = option_of(DirectionOptions, "tgt_lang")
    zero_shot: bool = option_of(DirectionOptions, "zero_shot")


OPTIONS = ExploreOptions
KIND_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}
AXIS_NAMES = {"encoder": ("source (queries)", "source (keys)"),
              "decoder": ("decoder input (queries)", "decoder input (keys)"),
              "cross": ("decoder input (queries)", "source (keys)")}
KINDS = tuple(ATTENTION_KINDS)  # encoder, decoder, cross
SCALE = 255  # weights are stored as round(SCALE * weight) in one byte
PAGE_ASSETS = Path(__file__).with_name("explore_page.js"), Path(__file__).with_name("explore_page.css")


@dataclass
class SentenceAttention:
    """One sentence's attention. ``weights[kind]`` (layers, heads, queries, keys); ``entropy[kind]`` (layers,
    heads), the mean entropy in nats of each head's rows. Encoder queries and keys are ``source_pieces``
    (ending in ``</s>``); decoder queries (and self-attention keys) are ``target_pieces`` (``<s>`` first)."""

    source: str
    translation: str
    source_pieces: list[str]
    target_pieces: list[str]
    weights: dict[str, Tensor]
    entropy: dict[str, Tensor]


@dataclass
class Attention:
    """What ``attention`` returns: the sentences, and the head gates in force (kind -> (layers, heads), 0 = off)."""

    sentences: list[SentenceAttention]
    gates: dict[str, Tensor]


@torch.no_grad()
def attention(model: Transformer, tokenizer: Tokenizer, sentences: list[str], decode: DecodeConfig | None = None,
              translations: list[str] | None = None, direction: Direction | None = None, **changes) -> Attention:
    """Translate ``sentences`` (blank ones are skipped; the search: ``decode`` with ``changes``, as
    ``translate_ids``) and return every head's attention on each, the decoder teacher-forced with the
    translation, or with ``translations`` when given (one per sentence, e.g. the references). The model's
    head gates (``head_gates.set_gates``) apply. ``direction``: a tagged model's (inference/directions.py): the
    sources read with their tag, and style decoder the forced target tag in the decoder's input, as translate."""
    decode = decode_settings(decode, **changes)
    if translations is not None and len(translations) != len(sentences):
        raise ValueError(f"{len(translations)} translations for {len(sentences)} sentences")
    keep = [i for i, s in enumerate(sentences) if s.strip()]
    if not keep:
        raise ValueError("no sentence to explore: give sentences as arguments or input=FILE")
    sentences = [sentences[i] for i in keep]
    if translations is None:
        sources, results = translate_ids(model, tokenizer, sentences, decode, direction=direction)
    else:
        sources = encode_sources(tokenizer, sentences, model.config.max_positions, direction=direction)
        results = [[(ids, 0.0)] for ids in tokenizer.encode_batch([translations[i] for i in keep], target=True)]
    lead = [] if direction is None else direction.decoder_prefix(tokenizer)  # the decoder reads it, as trained
    out = []
    for sentence, src, hyps in zip(sentences, sources, results):
        hyp = hyps[0][0][: model.config.max_positions - 1 - len(lead)]
        weights = teacher_forced_attention(model, src, lead + hyp, tokenizer.bos_id)  # kind -> (layers, h, Lq, Lk)
        out.append(SentenceAttention(
            source=sentence.strip(), translation=tokenizer.decode(hyp),
            source_pieces=[tokenizer.id_to_piece(i) for i in src],
            target_pieces=[tokenizer.id_to_piece(i) for i in [tokenizer.bos_id, *lead, *hyp]],
            weights=weights, entropy={kind: attention_entropy(w.unsqueeze(0).flatten(1, 2)).view(w.shape[:2])
                                      for kind, w in weights.items()}))  # (layers, h)
    return Attention(out, gates(model))


def quantise(weights: Tensor) -> bytes:
    """(layers, h, Lq, Lk) floats in [0, 1] -> round(SCALE * w) as bytes, row-major."""
    return (weights.clamp(0, 1) * SCALE).round().to(torch.uint8).contiguous().numpy().tobytes()


def page_data(result: Attention) -> dict:
    """The JSON object the page reads (see the module docstring for the encoding)."""
    return {
        "format": "uint8 round(scale*weight), row-major (layer, head, query, key), base64", "scale": SCALE,
        "kinds": list(KINDS), "kind_names": KIND_NAMES, "axis_names": AXIS_NAMES,
        "gates": {kind: g.round().int().tolist() for kind, g in result.gates.items()},
        "sentences": [{
            "source": s.source, "translation": s.translation,
            "source_tokens": s.source_pieces, "target_tokens": s.target_pieces,
            "attention": {kind: {"shape": list(w.shape), "data": base64.b64encode(quantise(w)).decode("ascii")}
                          for kind, w in s.weights.items()},
            "entropy": {kind: [[round(float(v), 4) for v in row] for row in e] for kind, e in s.entropy.items()},
        } for s in result.sentences],
    }


def page_html(result: Attention, title: str = "Attention explorer") -> str:
    """One self-contained HTML page: the data, the script and the style inline."""
    script, style = (path.read_text(encoding="utf-8") for path in PAGE_ASSETS)
    # "<" escaped: no "</script>" or "<!--" inside the data can end the tag early.
    payload = json.dumps(page_data(result), ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
{style}</style>
</head>
<body>
<header>
  <h1>{html.escape(title)}</h1>
  <label>Sentence <select id="sentence"></select></label>
  <label>Kind <select id="kind"></select></label>
  <label>Layer <select id="layer"></select></label>
  <label>Head <select id="head"></select></label>
</header>
<p class="caption"><span id="source"></span> &rarr; <span id="translation"></span></p>
<p class="hint">Hover over a token (click to pin) to see what it attends to and what attends to it;
  <span id="axes"></span>.</p>
<main>
  <section><h2>Head view</h2><div id="head-view"></div></section>
  <section><h2>Matrix</h2><div id="matrix"></div></section>
</main>
<section>
  <h2>Model view: every layer &times; head (H: mean entropy in nats; click to select)</h2>
  <div id="model-view"></div>
</section>
<script type="application/json" id="explorer-data">{payload}</script>
<script>
{script}</script>
</body>
</html>
"""


def write_page(result: Attention, path: str | Path, title: str = "Attention explorer") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page_html(result, title), encoding="utf-8")
    return path


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(options, sentences): an argument ``key=value`` with a value without spaces (or quoted, as Hydra quotes:
    ``key='a b'``) is an option (an unknown key is then an error naming it, not a sentence), and so are ``-h`` and
    ``--help``; every other argument is a sentence."""
    options, sentences = [], []
    for arg in argv:
        is_option = arg in HELP_FLAGS or re.fullmatch(r"""[A-Za-z_][\w.]*=(\S*|'[^']*'|"[^"]*")""", arg)
        (options if is_option else sentences).append(arg)
    return options, sentences


def main(argv: list[str] | None = None) -> Path:
    option_args, sentences = split_arguments(command_argv(argv))
    options = parse_options(option_args, ExploreOptions, __doc__, USAGE)
    require_checkpoint(options)
    if options.input:
        sentences += read_lines(options.input)
    if options.importance and not options.prune:
        raise SystemExit("importance= is the table that prune= reads: give prune=FRACTION too (0 to 1)")
    model, tokenizer, meta = load_checkpoint(options.ckpt, map_location=options.device)
    direction = direction_of(options, meta)
    if options.prune:
        # Imported here: analyze_heads switches matplotlib to Agg, which a notebook importing explore must not get.
        from transformer_nmt.analysis.heads import pruned_heads, read_importance

        importance = options.importance or Path(options.ckpt).parent / "heads" / "head_importance.csv"
        try:
            removed = pruned_heads(read_importance(importance, model), options.prune)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        set_gates(model, removed)
        print(f"gated off {len(removed)} heads (prune={options.prune}, from {importance})")
    try:
        result = attention(model, tokenizer, sentences, values_of(DecodeConfig, options), direction=direction)
    except ValueError as error:  # no sentence
        raise SystemExit(str(error)) from None
    path = write_page(result, options.output, f"Attention explorer: {Path(options.ckpt).name}"
                      + (f" ({direction.name}{', zero-shot' if direction.zero_shot else ''})" if direction else ""))
    for s in result.sentences:
        print(f"{s.source}\t{s.translation}")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, {len(result.sentences)} sentences)")
    return path


if __name__ == "__main__":
    main()
