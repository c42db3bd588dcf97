"""Translate text with a checkpoint: one output line per input line, always.

    echo "A man is riding a bike." | python -m transformer_nmt.translate ckpt=RUN/checkpoints/last.ckpt
    python -m transformer_nmt.translate ckpt=model.ckpt input=in.en output=out.de beam=1

``--help`` lists every option with its default (the search's defaults live in ``DecodeConfig``); with
``n_best`` n > 1 each input line gives n lines ``LINE_NUMBER<TAB>SCORE<TAB>LOG_PROB<TAB>TRANSLATION`` (SCORE: the
length-normalised score the beam ranks by; LOG_PROB: the sum of the log-probabilities of the tokens and the eos).

Researchers' modes (docs/evaluation.md shows each): ``ckpt=[A,B,C]`` decodes with an ensemble (the mean of the
models' log-probabilities at each step; the models must share a tokenizer); ``sampling=true`` samples each line
(``temperature``, ``top_k``, ``top_p``; ``seed`` and the line number seed it, so a line's sample does not depend
on the batch); ``prefix=FILE`` forces each output to start with that file's line (a blank line: no prefix);
``score_reference=FILE`` decodes nothing and writes, per input line, ``LOG_PROB<TAB>PER_TOKEN<TAB>TOKENS``: the
log-probability of that file's line as the translation (its tokens and the eos), per token, and how many.
``constraints=FILE`` (beam search, engine=native) makes each output contain the phrases of that file's line
(phrases separated by tabs, a blank line: none; tokenized with the model's SentencePiece), by Post & Vilar's
dynamic beam allocation (generation/constrained.py); ``strategy=`` names the search (greedy | beam | sample;
left out: beam=1 means greedy, sampling=true sample) and ``no_repeat_ngram=N`` forbids any N-gram twice in an
output (generation/ngram_blocking.py), in every search.

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
the model's ``max_positions`` is cut to fit, with a warning naming the line, and still translated. Each
translation is written as one line of plain text (``plain_line``): a line break inside it (any boundary
``str.splitlines`` knows) becomes a space, and so does every other control character (C0, tab included, DEL,
C1); trailing whitespace goes. So a model that decodes a line feed or a tab keeps one line per input line and
the n-best TSV four fields, and no escape sequence reaches the terminal.
"""

from __future__ import annotations

import gzip
import os
import re
import sys
import warnings
import zlib
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, List, Optional

import torch

from transformer_nmt.data.language_tags import Direction
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.config import DecodeConfig, decode_settings
from transformer_nmt.generation.constrained import read_constraints, word_continuations
from transformer_nmt.generation.ensemble import Ensemble
from transformer_nmt.generation.processors import active_processors
from transformer_nmt.generation.sampling import check_sampling
from transformer_nmt.generation.search import Hypothesis
from transformer_nmt.generation.strategies import SearchBatch, generate, strategy_name
from transformer_nmt.inference.alignment import (
    ALIGNMENT_MODES,
    AlignmentOptions,
    align,
    alignment_line,
    check_alignment_options,
)
from transformer_nmt.inference.batches import token_batches
from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
from transformer_nmt.inference.directions import DirectionOptions, direction_of
from transformer_nmt.inference.ensemble import checkpoint_paths, load_ensemble
from transformer_nmt.inference.export import cached_export
from transformer_nmt.inference.scoring import token_log_probs
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.options import command_argv, option, option_of, parse_options, require_checkpoint, show, values_of

USAGE = "python -m transformer_nmt.translate ckpt=PATH [key=value ...] < input > output"
CKPT_HELP = "a checkpoint written by python -m transformer_nmt.train; [A,B,...]: an ensemble (engine=native)"
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")


@dataclass
class ModelOptions(DecodeConfig):
    """What translate, evaluate and synthesize share: every decoding setting (DecodeConfig's fields, defaults and
    help), and the model."""

    ckpt: Optional[Any] = option(None, CKPT_HELP + " (or model_dir=, with engine=ctranslate2)")
    model_dir: Optional[str] = option(None, "engine=ctranslate2: a directory written by python -m "
                                            "transformer_nmt.export (instead of ckpt, which is exported to a cache)")
    src_lang: Optional[str] = option_of(DirectionOptions, "src_lang")
    tgt_lang: Optional[str] = option_of(DirectionOptions, "tgt_lang")
    zero_shot: bool = option_of(DirectionOptions, "zero_shot")


@dataclass
class TranslateOptions(ModelOptions):
    input: Optional[str] = option(None, "the text to translate, one sentence a line (.gz too); null: stdin")
    output: Optional[str] = option(None, "where the translations go, one line per input line (line breaks, tabs and "
                                         "other control characters inside a translation written as spaces); null: "
                                         "stdout. Never a file translate reads (input=, prefix=, score_reference=, "
                                         "ckpt=): refused")
    n_best: int = option_of(DecodeConfig, "n_best", help="hypotheses per input, best first (<= beam); n > 1: "
                                                           "n lines LINE_NUMBER<TAB>SCORE<TAB>LOG_PROB<TAB>"
                                                           "TRANSLATION each")
    prefix: Optional[str] = option(None, "a file, one line per input line: each output starts with that line "
                                         "(a blank line: no prefix)")
    constraints: Optional[str] = option(None, "a file, one line per input line: phrases (separated by tabs) that "
                                              "line's output must contain; a blank line: none (beam search, "
                                              "engine=native)")
    score_reference: Optional[str] = option(None, "a file, one translation per input line: write each one's "
                                                  "log-probability (LOG_PROB<TAB>PER_TOKEN<TAB>TOKENS), decode "
                                                  "nothing")
    print_alignment: Optional[str] = option(None, "hard | soft: each translation's word alignment after a tab "
                                                  "(engine=native); null: none")
    alignment_layer: int = option_of(AlignmentOptions, "alignment_layer")
    alignment_heads: Optional[List[int]] = option_of(AlignmentOptions, "alignment_heads")
    alignment_position: str = option_of(AlignmentOptions, "alignment_position")


OPTIONS = TranslateOptions  # what test_docs checks the docs' commands against


def one_line(text: str) -> str:
    """``text`` as one line of a file that any reader splits as we do: every line boundary ``str.splitlines``
    knows (a lone CR, LF, VT, FF, U+001C-U+001E, NEL, U+2028, U+2029) becomes a space, and trailing whitespace,
    which sacrebleu's command line strips, goes."""
    return " ".join(text.splitlines()).rstrip()


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0 (tab included), DEL, C1


def plain_line(text: str) -> str:
    """A decoded translation as translate writes it: ``one_line(text)``, then every control character (C0, tab
    included, DEL, C1) a space. One line per input line holds whatever a vocabulary decodes to (a byte-fallback
    piece, an imported model's pieces), a tab never splits the n-best TSV, and no escape sequence reaches a
    terminal."""
    return CONTROL.sub(" ", one_line(text))


def encode_sources(tokenizer: Tokenizer, lines: list[str], max_positions: int,
                   first_line: int = 0, direction: Direction | None = None) -> list[list[int] | None]:
    """Source ids + eos per line; None for a blank line. Over-long lines are cut, with a warning naming the line
    (``first_line``: the index of ``lines[0]`` in the whole input). ``direction``: a tagged model's, whose rule
    puts its tag first (data/language_tags.py)."""
    sources: list[list[int] | None] = []
    texts = [line.strip() for line in lines]
    encoded = tokenizer.encode_batch(texts) if direction is None else direction.encode(tokenizer, texts)
    for number, ids in enumerate(encoded, start=first_line + 1):
        if not lines[number - first_line - 1].strip():
            sources.append(None)
            continue
        if len(ids) + 1 > max_positions:
            warnings.warn(f"input line {number}: {len(ids) + 1} tokens exceed max_positions ({max_positions}); "
                          f"translating its first {max_positions - 1} tokens", stacklevel=2)
            ids = ids[: max_positions - 1]
        sources.append(ids + [tokenizer.eos_id])
    return sources


def check_decode(decode: DecodeConfig) -> None:
    """A ValueError naming the option for settings that cannot decode together."""
    if decode.beam < 1 or not 1 <= decode.n_best <= decode.beam:
        raise ValueError(f"need beam >= 1 and 1 <= n_best <= beam, got beam={decode.beam}, n_best={decode.n_best}")
    name = strategy_name(decode)  # a strategy the older flags contradict: refused, naming both
    if name != "beam" and decode.n_best != 1:
        raise ValueError(f"strategy={name} gives one output per line: drop n_best={decode.n_best}")
    active_processors(decode)  # a processor option's bad value: refused, naming it
    if decode.sampling or name == "sample":
        check_sampling(decode.temperature, decode.top_k, decode.top_p)
        if decode.beam not in (1, DecodeConfig.beam) or decode.n_best != 1:
            raise ValueError(f"sampling=true draws one output per line: drop beam={decode.beam} and "
                             f"n_best={decode.n_best}")
    else:
        given = [f"{name}={getattr(decode, name)}" for name in SAMPLING_OPTIONS
                 if getattr(decode, name) != getattr(DecodeConfig, name)]
        if given:
            raise ValueError(f"{' '.join(given)} set(s) how to sample: add sampling=true (or strategy=sample), or "
                             f"drop it")


def encode_prefixes(tokenizer: Tokenizer, prefixes: list[str] | None, n_lines: int) -> list[list[int]] | None:
    """Each line's forced target ids (blank: none); None without prefixes. The count must match the input's."""
    if prefixes is None:
        return None
    if len(prefixes) != n_lines:
        raise ValueError(f"prefix file has {len(prefixes)} lines but the input {n_lines}: give one per input line")
    return [ids if line.strip() else [] for line, ids in zip(prefixes, tokenizer.encode_batch(
        [line.strip() for line in prefixes]))]


def engine_searches_itself(model) -> bool:
    """Whether ``model`` batches and searches on its own (an engine such as CTranslate2's, which declares it with
    ``searches_itself``) instead of through generation/strategies."""
    return getattr(model, "searches_itself", False)


@torch.no_grad()
def translate_hypotheses(model: Transformer | Ensemble | CTranslate2Model, tokenizer: Tokenizer, lines: list[str],
                         decode: DecodeConfig | None = None, prefixes: list[str] | None = None, first_line: int = 0,
                         direction: Direction | None = None, constraints: list[list[list[int]]] | None = None,
                         **changes                         ) -> tuple[list[list[int] | None], list[list[Hypothesis]]]:
    """Translate ``lines``: (source ids as ``encode_sources`` gives them, and for each line its ``n_best``
    hypotheses (target ids without bos/eos, score, log_prob), best first, in input order). The search: ``decode``
    with ``changes`` (``beam=1``, ``sampling=True``, ...; ``decode_settings``); ``prefixes``: one target text per
    line that its output starts with. Greedy decoding and sampling score 0.0; a blank line gives empty hypotheses.
    ``first_line``: the index of ``lines[0]`` in the whole input, so that a line's sample (seeded by its index) is
    the same whether the input is translated at once or in parts. ``direction``: a tagged model's (its source tag
    first; style decoder: its target tag forced first, and stripped from the hypotheses). ``constraints``: per line
    the phrases (target ids, ``read_constraints``) its output must contain."""
    decode = decode_settings(decode, **changes)
    check_decode(decode)
    sources = encode_sources(tokenizer, lines, model.config.max_positions, first_line, direction)
    forced = encode_prefixes(tokenizer, prefixes, len(lines))
    lead = [] if direction is None else direction.decoder_prefix(tokenizer)
    if lead:
        forced = [lead + ids for ids in (forced or [[] for _ in lines])]
    if constraints is not None and len(constraints) != len(lines):
        raise ValueError(f"{len(constraints)} lines of constraints for {len(lines)} input lines")
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0)] * decode.n_best for _ in lines]
    todo = [i for i, ids in enumerate(sources) if ids is not None]
    continuations = word_continuations(tokenizer) if constraints is not None and any(constraints) else None
    if engine_searches_itself(model):  # batches and searches on its own, refusing what it cannot honour
        model.check_request(decode, has_constraints=constraints is not None and any(constraints))
        outputs = model.translate_hypotheses([sources[i] for i in todo], decode,
                                             prefixes=None if forced is None else [forced[i] for i in todo])
        for i, hyps in zip(todo, outputs):
            results[i] = hyps
        return sources, untagged(results, direction, lead)
    device = model.device
    for batch in token_batches([len(sources[i]) for i in todo], decode.max_tokens):
        rows = [todo[j] for j in batch]
        longest = max(len(sources[i]) for i in rows)
        src = torch.full((len(rows), longest), model.config.pad_id, dtype=torch.long)
        for r, i in enumerate(rows):
            src[r, : len(sources[i])] = torch.tensor(sources[i])
        src = src.to(device)
        prefix = None
        if forced is not None and any(forced[i] for i in rows):
            prefix = torch.full((len(rows), max(len(forced[i]) for i in rows)), -1, dtype=torch.long)  # (b, P)
            for r, i in enumerate(rows):
                prefix[r, : len(forced[i])] = torch.tensor(forced[i], dtype=torch.long)
            prefix = prefix.to(device)
        batch = SearchBatch(src, tokenizer.bos_id, tokenizer.eos_id, [first_line + i for i in rows], prefix,
                            None if constraints is None else [constraints[i] for i in rows], continuations)
        outputs = generate(model, batch, decode)
        for i, hyps in zip(rows, outputs):
            results[i] = hyps
    return sources, untagged(results, direction, lead)


def untagged(results: list[list[Hypothesis]], direction: Direction | None, lead: list[int]) -> list[list[Hypothesis]]:
    """The hypotheses without the decoder-side language tag forced first (``lead``; data.lang_tags=decoder)."""
    if not lead:
        return results
    return [[replace(h, tokens=direction.strip(h.tokens, lead)) for h in hyps] for hyps in results]


def translate_ids(model: Transformer | Ensemble | CTranslate2Model, tokenizer: Tokenizer, lines: list[str],
                  decode: DecodeConfig | None = None, **changes
                  ) -> tuple[list[list[int] | None], list[list[tuple[list[int], float]]]]:
    """As ``translate_hypotheses``, each hypothesis as a (target ids, score) pair."""
    sources, results = translate_hypotheses(model, tokenizer, lines, decode, **changes)
    return sources, [[(h.tokens, h.score) for h in hyps] for hyps in results]


def translate_lines(model: Transformer | CTranslate2Model, tokenizer: Tokenizer, lines: list[str],
                    decode: DecodeConfig | None = None, **changes) -> list[list[tuple[str, float]]]:
    """Translate ``lines``; for each, its ``n_best`` (translation, score) pairs, best first, in input order.
    The search as ``translate_ids``'s; greedy decoding (``beam`` 1) scores 0.0."""
    _, results = translate_ids(model, tokenizer, lines, decode, **changes)
    return [[(tokenizer.decode(ids), score) for ids, score in hyps] for hyps in results]


def read_lines(path: str | Path | None) -> list[str]:
    """Lines of a UTF-8 file (``.gz`` too) or of stdin, split on "\n" only: universal newlines or
    str.splitlines would also split on a lone "\r" or Unicode separators and change the line count. A final
    line without newline is kept; invalid UTF-8, and a ``.gz`` cut short or corrupt, are errors naming the file."""
    name = "<stdin>" if path is None else str(path)
    if path is None:
        raw = sys.stdin.buffer.read()
    elif not Path(path).is_file():
        raise SystemExit(f"file {path} does not exist")
    elif name.endswith(".gz"):
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read()
        except (EOFError, OSError, zlib.error) as error:  # cut short, or not gzip at all
            raise SystemExit(f"{name}: not a complete gzip file ({error}): it is truncated or corrupt; copy or "
                             f"compress it again") from None
    else:
        raw = Path(path).read_bytes()
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


def load_model(options) -> tuple[Transformer | Ensemble | CTranslate2Model, Tokenizer, dict]:
    """(model, tokenizer, meta) for ``options.engine`` (options as translate's or evaluate's): the checkpoint's
    Transformer, or the Ensemble of several (native), or its CTranslate2 export (``model_dir``, else ``ckpt``
    exported to the cache). ``meta`` as ``load_checkpoint``'s (an ensemble's: its first checkpoint's); from an
    export, also ``source``: its transformer_nmt.json, for messages."""
    if options.engine == "native":
        for name in ("model_dir", "compute_type"):
            if getattr(options, name) not in (None, DecodeConfig.compute_type):
                raise SystemExit(f"{name}= is an option of engine=ctranslate2 (the native engine reads ckpt=PATH)")
        if options.inter_threads:
            raise SystemExit("inter_threads= is an option of engine=ctranslate2 (the native engine: threads=N)")
        if options.threads:
            torch.set_num_threads(options.threads)
        return load_ensemble(checkpoint_paths(options.ckpt), map_location=options.device)
    if options.engine == "ctranslate2":
        if options.ckpt is not None and len(checkpoint_paths(options.ckpt)) > 1:
            raise SystemExit("engine=ctranslate2 decodes one model: an ensemble (ckpt=[A,B,...]) needs engine=native")
        if isinstance(options.ckpt, list):
            options.ckpt = options.ckpt[0]
        if options.ckpt and options.model_dir:
            raise SystemExit("give ckpt=PATH (exported to a cache) or model_dir=DIR (an export), not both")
        model_dir = options.model_dir or cached_export(options.ckpt)
        model = CTranslate2Model(model_dir, options.device, options.compute_type, options.threads,
                                 options.inter_threads)
        meta = {**model.info, "path": options.ckpt or str(model_dir), "source": f"export {model.info_path}"}
        return model, model.tokenizer, meta
    raise SystemExit(f"engine={options.engine!r}: use native or ctranslate2")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether paths ``a`` and ``b`` name one file (another spelling, a symbolic or a hard link), or would."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def checkpoint_reads(ckpt) -> list[tuple[str, str]]:
    """``("ckpt", PATH)`` for each checkpoint ``ckpt=`` names (one, or an ensemble's list)."""
    return [("ckpt", path) for path in (checkpoint_paths(ckpt) if ckpt else [])]


def read_by(output: str | os.PathLike, reads: list[tuple[str, str | None]]) -> tuple[str, str] | None:
    """The first ``(option, path)`` of ``reads`` whose file ``output`` is (``same_file``), None where none is:
    writing ``output`` would destroy that input."""
    return next(((option, path) for option, path in reads if path and same_file(output, path)), None)


def check_output(options: TranslateOptions) -> None:
    """A SystemExit where ``output=`` names a file translate reads: opened for writing, it would be emptied before
    it is read."""
    if not options.output:
        return
    reads = [("input", options.input), ("prefix", options.prefix), ("score_reference", options.score_reference),
             ("constraints", options.constraints)]
    read = read_by(options.output, reads + checkpoint_reads(options.ckpt))
    if read is not None:
        raise SystemExit(f"output={options.output} is the file {read[0]}={read[1]} names: writing the translations "
                         f"there would empty it before it is read; write them to another file")


def main(argv: list[str] | None = None) -> None:
    options = parse_options(command_argv(argv), TranslateOptions, __doc__, USAGE)
    require_checkpoint(options)
    check_output(options)
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
    if mode and isinstance(options.ckpt, list) and len(options.ckpt) > 1:
        raise SystemExit("print_alignment= reads one model's cross-attention: give ckpt=PATH, not an ensemble")
    if options.score_reference and (options.prefix or mode or options.n_best != 1 or options.sampling
                                    or options.constraints):
        raise SystemExit("score_reference= scores given translations and decodes nothing: drop prefix=, "
                         "print_alignment=, n_best=, sampling= and constraints=")
    decode = values_of(DecodeConfig, options)
    try:
        check_decode(decode)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    model, tokenizer, meta = load_model(options)
    direction = direction_of(options, meta)
    if mode:
        try:
            check_alignment_options(model, *alignment)
        except ValueError as error:
            raise SystemExit(str(error)) from None
    lines = read_lines(options.input)

    def out_file():  # opened once every input is read
        return open(options.output, "w", encoding="utf-8") if options.output else nullcontext(sys.stdout)

    if options.score_reference:
        try:
            scores = token_log_probs(model, tokenizer, lines, read_lines(options.score_reference), decode.max_tokens,
                                     direction)
        except ValueError as error:
            raise SystemExit(f"score_reference={options.score_reference}: {error}") from None
        with out_file() as out:
            for token_scores in scores:
                total = sum(token_scores)
                out.write(f"{total:.4f}\t{total / len(token_scores):.4f}\t{len(token_scores)}\n")
        return
    prefixes = read_lines(options.prefix) if options.prefix else None
    constraints = None
    if options.constraints:
        try:
            constraints = read_constraints(options.constraints, read_lines(options.constraints), tokenizer,
                                           len(lines), model.config.max_positions - 1)
        except ValueError as error:
            raise SystemExit(str(error)) from None
    try:
        sources, results = translate_hypotheses(model, tokenizer, lines, decode, prefixes=prefixes, direction=direction,
                                                constraints=constraints)
    except ValueError as error:
        raise SystemExit(f"prefix={options.prefix}: {error}" if prefixes is not None else str(error)) from None
    with out_file() as out:
        for number, (src, hyps) in enumerate(zip(sources, results), start=1):
            for h in hyps:
                text = plain_line(tokenizer.decode(h.tokens))  # one line, no tab, no control character
                fields_ = [text] if options.n_best == 1 else [str(number), f"{h.score:.4f}", f"{h.log_prob:.4f}", text]
                if mode:
                    fields_.append(alignment_line(align(model, tokenizer, src, h.tokens, *alignment), mode)
                                   if src is not None and h.tokens else "")
                out.write("\t".join(fields_) + "\n")

if __name__ == "__main__":
    main()
