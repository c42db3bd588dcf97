"""Translate text with a checkpoint: one output line per input line, always.

    echo "A man is riding a bike." | python -m transformer_nmt.translate ckpt=RUN/checkpoints/last.ckpt
    python -m transformer_nmt.translate ckpt=model.ckpt input=in.en output=out.de beam=1

``--help`` lists every option with its default (the search's defaults live in ``DecodeConfig``); with
``n_best`` n > 1 each input line gives n lines ``LINE_NUMBER<TAB>SCORE<TAB>TRANSLATION``.

``engine=ctranslate2`` translates with CTranslate2 (``pip install -e ".[serve]"``), from ``model_dir=DIR``
(written by ``python -m transformer_nmt.export``) or from ``ckpt``, exported once to a cache
(``$XDG_CACHE_HOME/transformer_nmt/ctranslate2/``, keyed by the checkpoint's contents);
``compute_type`` (default: as exported; ``int8`` quantizes at load), ``threads`` (threads within each
operation) and ``inter_threads`` (batches decoded at once, each on ``threads`` threads) tune it; by default (0
and 0) one thread per batch and one batch per core, measured faster than all cores on each operation
(``threads=2`` alone: 2 threads on 1 batch at a time). The same rules apply as natively: same length limit,
length penalty and n-best.

``print_alignment=hard|soft`` (native engine) writes each translation's word alignment after a tab, as
fairseq's ``--print-alignment`` does: ``hard`` gives ``i-j`` pairs (source word i, target word j), ``soft``
each target word's weights over the source words (transformer_nmt.alignment says how pieces become words).
``alignment_layer`` (-1: the last decoder layer), ``alignment_heads`` (null: the mean of all heads, or a
list such as ``[0,3]``) and ``alignment_position`` (output: the query that predicts the target piece, or
input: the query whose input it is) choose the cross-attention used; without ``print_alignment`` they are an
error, not ignored.

Nothing is dropped or reordered: an empty (or blank) line gives an empty line; a line longer than
the model's ``max_positions`` is cut to fit, with a warning naming the line, and still translated.
"""

from __future__ import annotations

import gzip
import sys
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import List, Optional

import torch

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.inference.alignment import (ALIGNMENT_MODES, AlignmentOptions, align, alignment_line,
                                                 check_alignment_options)
from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
from transformer_nmt.inference.decode_config import DecodeConfig, decode_settings
from transformer_nmt.inference.export import cached_export
from transformer_nmt.model.decoding import beam_search, greedy_decode
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.options import (command_argv, option, option_of, parse_options, require_checkpoint, show,
                                     values_of)

USAGE = "python -m transformer_nmt.translate ckpt=PATH [key=value ...] < input > output"
CKPT_HELP = "a checkpoint written by python -m transformer_nmt.train"


@dataclass
class TranslateOptions:
    ckpt: Optional[str] = option(None, CKPT_HELP + " (or model_dir=, with engine=ctranslate2)")
    input: Optional[str] = option(None, "the text to translate, one sentence a line (.gz too); null: stdin")
    output: Optional[str] = option(None, "where the translations go, one line per input line; null: stdout")
    beam: int = option_of(DecodeConfig, "beam")
    alpha: float = option_of(DecodeConfig, "alpha")
    max_len_offset: int = option_of(DecodeConfig, "max_len_offset")
    max_tokens: int = option_of(DecodeConfig, "max_tokens")
    n_best: int = option_of(DecodeConfig, "n_best", help="hypotheses per input, best first (<= beam); n > 1: "
                                                           "n lines LINE_NUMBER<TAB>SCORE<TAB>TRANSLATION each")
    device: str = option_of(DecodeConfig, "device")
    engine: str = option_of(DecodeConfig, "engine")
    model_dir: Optional[str] = option(None, "engine=ctranslate2: a directory written by python -m "
                                            "transformer_nmt.export (instead of ckpt, which is exported to a cache)")
    compute_type: str = option_of(DecodeConfig, "compute_type")
    threads: int = option_of(DecodeConfig, "threads")
    inter_threads: int = option_of(DecodeConfig, "inter_threads")
    print_alignment: Optional[str] = option(None, "hard | soft: each translation's word alignment after a tab "
                                                  "(engine=native); null: none")
    alignment_layer: int = option_of(AlignmentOptions, "alignment_layer")
    alignment_heads: Optional[List[int]] = option_of(AlignmentOptions, "alignment_heads")
    alignment_position: str = option_of(AlignmentOptions, "alignment_position")


OPTIONS = TranslateOptions  # what test_docs checks the docs' commands against


def encode_sources(tokenizer: Tokenizer, lines: list[str], max_positions: int) -> list[list[int] | None]:
    """Source ids + eos per line; None for a blank line. Over-long lines are cut, with a warning."""
    sources: list[list[int] | None] = []
    for number, ids in enumerate(tokenizer.encode_batch([line.strip() for line in lines]), start=1):
        if not lines[number - 1].strip():
            sources.append(None)
            continue
        if len(ids) + 1 > max_positions:
            warnings.warn(f"input line {number}: {len(ids) + 1} tokens exceed max_positions ({max_positions}); "
                          f"translating its first {max_positions - 1} tokens", stacklevel=2)
            ids = ids[: max_positions - 1]
        sources.append(ids + [tokenizer.eos_id])
    return sources


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group indices, longest first, so that batch size x longest source <= max_tokens (one sentence at least)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[current[0]] > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


@torch.no_grad()
def translate_ids(model: Transformer | CTranslate2Model, tokenizer: Tokenizer, lines: list[str],
                  decode: DecodeConfig | None = None, **changes
                  ) -> tuple[list[list[int] | None], list[list[tuple[list[int], float]]]]:
    """Translate ``lines``: (source ids as ``encode_sources`` gives them, and for each line its ``n_best``
    (target ids without bos/eos, score) pairs, best first, in input order). The search: ``decode`` with
    ``changes`` (``beam=1``, ...; ``decode_settings``). Greedy decoding (``beam`` 1) scores 0.0; a blank line
    gives empty hypotheses."""
    decode = decode_settings(decode, **changes)
    beam, n_best, max_len_offset = decode.beam, decode.n_best, decode.max_len_offset
    if beam < 1 or not 1 <= n_best <= beam:
        raise ValueError(f"need beam >= 1 and 1 <= n_best <= beam, got beam={beam}, n_best={n_best}")
    sources = encode_sources(tokenizer, lines, model.config.max_positions)
    results: list[list[tuple[list[int], float]]] = [[([], 0.0)] * n_best for _ in lines]
    todo = [i for i, ids in enumerate(sources) if ids is not None]
    if isinstance(model, CTranslate2Model):  # batches and searches on its own
        outputs = model.translate_ids([sources[i] for i in todo], decode)
        for i, hyps in zip(todo, outputs):
            results[i] = hyps
        return sources, results
    device = model.positions.device
    for batch in token_batches([len(sources[i]) for i in todo], decode.max_tokens):
        rows = [todo[j] for j in batch]
        longest = max(len(sources[i]) for i in rows)
        src = torch.full((len(rows), longest), model.config.pad_id, dtype=torch.long)
        for r, i in enumerate(rows):
            src[r, : len(sources[i])] = torch.tensor(sources[i])
        src = src.to(device)
        if beam == 1:
            outputs = [[(ids, 0.0)] for ids in greedy_decode(model, src, max_len_offset=max_len_offset,
                                                              bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)]
        else:
            outputs = [[(h.tokens, h.score) for h in hyps] for hyps in beam_search(
                model, src, beam, decode.alpha, max_len_offset, n_best, tokenizer.bos_id, tokenizer.eos_id)]
        for i, hyps in zip(rows, outputs):
            results[i] = hyps
    return sources, results


def translate_lines(model: Transformer | CTranslate2Model, tokenizer: Tokenizer, lines: list[str],
                    decode: DecodeConfig | None = None, **changes) -> list[list[tuple[str, float]]]:
    """Translate ``lines``; for each, its ``n_best`` (translation, score) pairs, best first, in input order.
    The search as ``translate_ids``'s; greedy decoding (``beam`` 1) scores 0.0."""
    _, results = translate_ids(model, tokenizer, lines, decode, **changes)
    return [[(tokenizer.decode(ids), score) for ids, score in hyps] for hyps in results]


def read_lines(path: str | Path | None) -> list[str]:
    """Lines of a UTF-8 file (``.gz`` too) or of stdin, split on "\n" only: universal newlines or
    str.splitlines would also split on a lone "\r" or Unicode separators and change the line count. A final
    line without newline is kept; invalid UTF-8 is an error naming the file and line."""
    name = "<stdin>" if path is None else str(path)
    if path is None:
        raw = sys.stdin.buffer.read()
    elif not Path(path).is_file():
        raise SystemExit(f"file {path} does not exist")
    else:
        raw = gzip.open(path, "rb").read() if name.endswith(".gz") else Path(path).read_bytes()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    decoded = []
    for number, line in enumerate(lines, start=1):
        try:
            decoded.append(line.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as error:
            raise SystemExit(f"{name}:{number}: not valid UTF-8 ({error.reason} at byte {error.start})") from None
    return decoded


def load_model(options) -> tuple[Transformer | CTranslate2Model, Tokenizer, dict]:
    """(model, tokenizer, meta) for ``options.engine`` (options as translate's or evaluate's): the checkpoint's
    Transformer (native), or its CTranslate2 export (``model_dir``, else ``ckpt`` exported to the cache).
    ``meta`` as ``load_checkpoint``'s; from an export, also ``source``: its transformer_nmt.json, for messages."""
    if options.engine == "native":
        for name in ("model_dir", "compute_type"):
            if getattr(options, name) not in (None, DecodeConfig.compute_type):
                raise SystemExit(f"{name}= is an option of engine=ctranslate2 (the native engine reads ckpt=PATH)")
        if options.inter_threads:
            raise SystemExit("inter_threads= is an option of engine=ctranslate2 (the native engine: threads=N)")
        if options.threads:
            torch.set_num_threads(options.threads)
        return load_checkpoint(options.ckpt, map_location=options.device)
    if options.engine == "ctranslate2":
        if options.ckpt and options.model_dir:
            raise SystemExit("give ckpt=PATH (exported to a cache) or model_dir=DIR (an export), not both")
        model_dir = options.model_dir or cached_export(options.ckpt)
        model = CTranslate2Model(model_dir, options.device, options.compute_type, options.threads,
                                 options.inter_threads)
        meta = {**model.info, "path": options.ckpt or str(model_dir), "source": f"export {model.info_path}"}
        return model, model.tokenizer, meta
    raise SystemExit(f"engine={options.engine!r}: use native or ctranslate2")


def main(argv: list[str] | None = None) -> None:
    options = parse_options(command_argv(argv), TranslateOptions, __doc__, USAGE)
    require_checkpoint(options)
    mode = options.print_alignment
    chosen = values_of(AlignmentOptions, options)
    alignment = (chosen.alignment_layer, chosen.alignment_heads, chosen.alignment_position)
    if mode is None:
        given = [f"{f.name}={show(getattr(chosen, f.name))}" for f in fields(AlignmentOptions)
                 if getattr(chosen, f.name) != getattr(AlignmentOptions(), f.name)]
        if given:
            raise SystemExit(f"{' '.join(given)} chooses the attention of print_alignment=hard|soft: add "
                             "print_alignment=hard or print_alignment=soft, or drop it")
    elif mode not in ALIGNMENT_MODES:
        raise SystemExit(f"print_alignment={mode!r}: use hard or soft")
    elif options.engine != "native":
        raise SystemExit("print_alignment= needs engine=native (it reads the model's cross-attention)")
    model, tokenizer, _ = load_model(options)
    if mode:
        try:
            check_alignment_options(model, *alignment)
        except ValueError as error:
            raise SystemExit(str(error)) from None
    lines = read_lines(options.input)
    sources, results = translate_ids(model, tokenizer, lines, values_of(DecodeConfig, options))
    with (open(options.output, "w", encoding="utf-8") if options.output else nullcontext(sys.stdout)) as out:
        for number, (src, hyps) in enumerate(zip(sources, results), start=1):
            for ids, score in hyps:
                fields_ = [tokenizer.decode(ids)] if options.n_best == 1 else [str(number), f"{score:.4f}",
                                                                               tokenizer.decode(ids)]
                if mode:
                    fields_.append(alignment_line(align(model, tokenizer, src, ids, *alignment), mode)
                                   if src is not None and ids else "")
                out.write("\t".join(fields_) + "\n")


if __name__ == "__main__":
    main()
