"""Parallel corpora: reading raw sentence pairs from disk or the Hub, and filtering them.

A split is read once into an Arrow file with one string column per language (e.g. ``en``, ``de``),
so that switching the translation direction reuses everything cached. Four formats:

- ``text``:  fairseq-style parallel plain text, ``PREFIX.{lang}`` or ``PREFIX.{lang}.gz``, line i of one
  file translates line i of the other;
- ``tsv``:   one pair per line, ``sentence<TAB>sentence``, columns named by ``columns`` (default src, tgt);
- ``jsonl``: one object per line, ``{"en": ..., "de": ...}`` or ``{"translation": {"en": ..., "de": ...}}``;
- ``hub``:   a ``datasets`` dataset with a ``translation`` column (WMT14 on the Hub, a directory saved with
  ``save_to_disk``, or a directory of JSON files with that schema), split names as locations.

Every reader yields chunks of ``(sentence_lang0, sentence_lang1)`` so memory does not grow with the corpus.
Bad bytes: invalid UTF-8 and C0 control characters other than tab (NUL, escape, a carriage return or
line feed inside a sentence, ...) are errors naming the file and line; or, with ``utf8_errors=replace`` /
``control_chars=replace``, they become U+FFFD / a space, and the lines or sentences changed are counted.
Filtering (``filter_pairs``) works on token lengths and reports what it dropped and why.
"""

from __future__ import annotations

import contextlib
import gzip
import inspect
import io
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from pathlib import Path

import numpy as np
import pyarrow as pa

from transformer_nmt.file_digest import content_digest

FORMATS = ("text", "tsv", "jsonl", "hub")
CHUNK_PAIRS = 20_000  # pairs per Arrow record batch while reading
CONTROL = re.compile("[\x00-\x08\x0a-\x1f]")  # C0 control characters except tab
CONTROL_NAMES = {"\x00": "NUL", "\n": "a line feed", "\r": "a carriage return", "\x1b": "ESC"}
# A language code (data.src_lang, data.tgt_lang): it becomes a file name's suffix (PREFIX.{lang}) and a column name,
# so nothing but letters, digits, _ and -, a letter first: never a path separator, "..", a newline or a blank.
LANG_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,15}")


class CorpusError(ValueError):
    """A corpus that cannot be read as configured; the message says where and what to change."""


@dataclass(frozen=True)
class CorpusSpec:
    """Where the sentence pairs of each split live and how to read them (the ``data`` config)."""

    format: str
    langs: tuple[str, str]  # (src_lang, tgt_lang) as configured; the Arrow columns carry these names
    locations: dict[str, str | list[str] | None]  # split ("train", "val", "test") -> prefix, file, or hub split
    # name; data.train=[A,B,...]: a list (the datamodule reads each with corpus_of)
    columns: tuple[str, str] | None = None  # tsv: the language of each column
    hub_name: str | None = None
    hub_config: str | None = None
    utf8_errors: str = "strict"  # strict: error naming file and line | replace: U+FFFD, counted
    control_chars: str = "strict"  # strict: error naming file and line | replace: a space, counted

    def __post_init__(self):
        for option, lang in zip(("data.src_lang", "data.tgt_lang"), self.langs):
            check_lang(lang, option)
        if self.format not in FORMATS:
            raise CorpusError(f"data.format={self.format!r} is not one of {FORMATS}")
        for key in ("utf8_errors", "control_chars"):
            if getattr(self, key) not in ("strict", "replace"):
                raise CorpusError(f"data.{key}={getattr(self, key)!r}: use 'strict' or 'replace'")
        if self.langs[0] == self.langs[1]:
            raise CorpusError(f"data.src_lang and data.tgt_lang are both {self.langs[0]!r}")
        if self.columns is not None and sorted(self.columns) != sorted(self.langs):
            raise CorpusError(f"data.columns={list(self.columns)} must name the two languages {list(self.langs)}")
        if self.format == "hub" and not self.hub_name:
            raise CorpusError("data.format=hub needs data.hub_name (e.g. wmt/wmt14, or a local dataset directory)")


def check_lang(lang, option: str) -> None:
    """A ``CorpusError`` naming ``option`` unless ``lang`` is a language code (``LANG_CODE``)."""
    if not isinstance(lang, str) or not LANG_CODE.fullmatch(lang):
        raise CorpusError(f"{option}={lang!r:.40} is not a language code: give 1 to 16 letters, digits, _ or -, a "
                          f"letter first (en, de, pt_BR, zh-Hant); it names the files PREFIX.{{lang}} and the columns")


@dataclass
class ReadStats:
    """What reading a split counted besides the pairs themselves."""

    pairs: int = 0
    utf8_replaced_lines: int = 0
    control_replaced_sentences: int = 0
    sources: list[str] = field(default_factory=list)  # files or hub ids read


# --------------------------------------------------------------------------------------------------- reading


def split_inputs(spec: CorpusSpec, split: str) -> list[str]:
    """The files (or hub id) a split is read from, checked to exist; used for cache keys and messages."""
    location = spec.locations.get(split)
    key = f"data.{split}"
    if isinstance(location, (list, tuple)) and location:  # data.train=[A,B,...]: every corpus's inputs
        return [path for one in location for path in split_inputs(corpus_of(spec, split, one), split)]
    if location is None or location == "":
        raise CorpusError(f"{key} is not set: give a path prefix (format=text), a file (tsv/jsonl) or a split name "
                          "(hub)")
    if spec.format == "text":
        return [str(_text_file(location, lang, key)) for lang in spec.langs]
    if spec.format in ("tsv", "jsonl"):
        path = Path(location)
        if not path.is_file():
            raise CorpusError(f"{key}: file {path} does not exist (resolved to {path.absolute()}); fix the path")
        return [str(path)]
    local = Path(spec.hub_name)
    if local.exists():
        return [str(local)]
    return [f"hub:{spec.hub_name}/{spec.hub_config}/{location}"]


def corpus_of(spec: CorpusSpec, split: str, location: str) -> CorpusSpec:
    """``spec`` with ``split`` at ``location``: one corpus of a split given as several (data.train=[A,B,...])."""
    return replace(spec, locations={**spec.locations, split: location})


def _text_file(prefix: str, lang: str, key: str) -> Path:
    candidates = [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]
    for path in candidates:
        if path.is_file():
            return path
    tried = " or ".join(str(p) for p in candidates)
    raise CorpusError(
        f"{key}={prefix!r}: no file {tried} (from {Path.cwd()}); {key} is a path prefix, "
        f"the files are PREFIX.{{src_lang}} and PREFIX.{{tgt_lang}}, optionally gzipped"
    )


def read_pairs(spec: CorpusSpec, split: str, stats: ReadStats) -> Iterator[tuple[list[str], list[str]]]:
    """Yield chunks ``(lang0_sentences, lang1_sentences)`` of a split, stripped of surrounding whitespace."""
    if isinstance(spec.locations.get(split), (list, tuple)):
        raise CorpusError(f"data.{split} lists several corpora: read each (corpus_of), they are one split only "
                          f"once tokenized")
    inputs = split_inputs(spec, split)
    stats.sources = inputs
    if spec.format == "text":
        yield from _chunks(_read_text(Path(inputs[0]), Path(inputs[1]), spec, stats), stats)
    elif spec.format == "tsv":
        yield from _chunks(_read_tsv(Path(inputs[0]), spec, stats), stats)
    elif spec.format == "jsonl":
        yield from _chunks(_read_jsonl(Path(inputs[0]), spec, stats), stats)
    else:
        yield from _read_hub(spec, split, stats)


def _chunks(pairs: Iterator[tuple[str, str]], stats: ReadStats) -> Iterator[tuple[list[str], list[str]]]:
    """Group a stream of (sentence, sentence) pairs into chunks of CHUNK_PAIRS, counting them."""
    chunk0, chunk1 = [], []
    for sentence0, sentence1 in pairs:
        chunk0.append(sentence0)
        chunk1.append(sentence1)
        stats.pairs += 1
        if len(chunk0) == CHUNK_PAIRS:
            yield chunk0, chunk1
            chunk0, chunk1 = [], []
    if chunk0:
        yield chunk0, chunk1


@contextlib.contextmanager
def _open_lines(path: Path) -> Iterator[Iterator[bytes]]:
    """The raw lines of ``path``, gunzipped where it starts with gzip's magic bytes; a gzip stream that breaks off
    (a truncated download or copy) is a ``CorpusError`` naming the file and the last line read."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as f:
        yield _gzip_lines(f, path) if gzipped else f


def _gzip_lines(f: io.BufferedIOBase, path: Path) -> Iterator[bytes]:
    line_no = 0
    try:
        for line_no, raw in enumerate(f, start=1):
            yield raw
    except (EOFError, OSError, zlib.error) as error:
        raise CorpusError(f"{path}: the gzip stream breaks off after line {line_no} ({error}): the file is truncated "
                          f"or corrupt; download, copy or compress it again") from None


def _decode(raw: bytes, path: Path, line_no: int, errors: str, stats: ReadStats) -> str:
    try:
        text = raw.decode("utf-8")
        return text[1:] if line_no == 1 and text.startswith("\ufeff") else text  # drop a byte-order mark
    except UnicodeDecodeError as e:
        if errors == "strict":
            raise CorpusError(
                f"{path}:{line_no}: invalid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                f"convert the file to UTF-8 (e.g. iconv), or set data.utf8_errors=replace to replace bad bytes "
                f"with U+FFFD"
            ) from None
        stats.utf8_replaced_lines += 1
        return raw.decode("utf-8", errors="replace")


def _clean(sentence: str, spec: CorpusSpec, stats: ReadStats, where, line_no: int) -> str:
    """The sentence, checked for C0 control characters (except tab): an error naming ``where:line_no``,
    or with ``control_chars=replace`` each one replaced by a space (as Moses' remove-non-printing-char does)."""
    found = CONTROL.search(sentence)
    if found is None:
        return sentence
    if spec.control_chars == "strict":
        char = found.group()
        name = CONTROL_NAMES.get(char, "a control character")
        raise CorpusError(
            f"{where}{':' if isinstance(where, Path) else ' '}{line_no}: U+{ord(char):04X} ({name}) at column "
            f"{found.start() + 1}; remove it from the corpus, or set data.control_chars=replace to replace "
            f"control characters by spaces"
        )
    stats.control_replaced_sentences += 1
    return CONTROL.sub(" ", sentence)


def _read_text(src_path: Path, tgt_path: Path, spec: CorpusSpec, stats: ReadStats):
    errors = spec.utf8_errors
    with _open_lines(src_path) as src_file, _open_lines(tgt_path) as tgt_file:
        for line_no, (raw0, raw1) in enumerate(zip_longest(src_file, tgt_file), start=1):
            if raw0 is None or raw1 is None:  # one file ended: count the rest of the other
                rest = 1 + sum(1 for _ in (tgt_file if raw0 is None else src_file))
                n0, n1 = (line_no - 1, line_no - 1 + rest) if raw0 is None else (line_no - 1 + rest, line_no - 1)
                raise CorpusError(
                    f"line counts differ: {src_path} has {n0} lines, {tgt_path} has {n1}; "
                    f"parallel files must be aligned line by line"
                )
            yield (_clean(_decode(raw0, src_path, line_no, errors, stats).strip(), spec, stats, src_path, line_no),
                   _clean(_decode(raw1, tgt_path, line_no, errors, stats).strip(), spec, stats, tgt_path, line_no))


def _read_tsv(path: Path, spec: CorpusSpec, stats: ReadStats):
    columns = spec.columns or spec.langs
    order = [columns.index(lang) for lang in spec.langs]  # column holding langs[0], langs[1]
    with _open_lines(path) as f:
        for line_no, raw in enumerate(f, start=1):
            fields = _decode(raw, path, line_no, spec.utf8_errors, stats).rstrip("\r\n").split("\t")
            if len(fields) != 2:
                raise CorpusError(
                    f"{path}:{line_no}: expected 2 tab-separated columns ({columns[0]}, {columns[1]}), "
                    f"found {len(fields)}"
                )
            yield (_clean(fields[order[0]].strip(), spec, stats, path, line_no),
                   _clean(fields[order[1]].strip(), spec, stats, path, line_no))


def _read_jsonl(path: Path, spec: CorpusSpec, stats: ReadStats):
    with _open_lines(path) as f:
        for line_no, raw in enumerate(f, start=1):
            text = _decode(raw, path, line_no, spec.utf8_errors, stats).strip()
            if not text:
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            pair = record.get("translation", record) if isinstance(record, dict) else None
            if not isinstance(pair, dict) or any(lang not in pair for lang in spec.langs):
                raise CorpusError(
                    f"{path}:{line_no}: expected {{{spec.langs[0]!r}: ..., {spec.langs[1]!r}: ...}} "
                    f"or {{'translation': {{...}}}}, found {text[:80]!r}"
                )
            for lang in spec.langs:
                if not isinstance(pair[lang], str):  # null, a number, a list: str() would make a sentence of it
                    raise CorpusError(f"{path}:{line_no}: {lang!r} is {json.dumps(pair[lang])[:80]}, not a string; "
                                      f"give the sentence as a JSON string (an empty one is \"\")")
            yield (_clean(pair[spec.langs[0]].strip(), spec, stats, path, line_no),
                   _clean(pair[spec.langs[1]].strip(), spec, stats, path, line_no))


def load_hub_split(spec: CorpusSpec, split: str):
    """The ``datasets.Dataset`` of one split with a ``translation`` column, from a local directory or the Hub."""
    import datasets

    location = spec.locations[split]
    local = Path(spec.hub_name)
    try:
        if (local / "dataset_dict.json").is_file() or (local / "dataset_info.json").is_file():
            loaded = datasets.load_from_disk(str(local))
            return loaded[location] if isinstance(loaded, datasets.DatasetDict) else loaded
        # Never a dataset's loading script: datasets >= 4 runs none; older versions are told not to
        no_scripts = ({"trust_remote_code": False}
                      if "trust_remote_code" in inspect.signature(datasets.load_dataset).parameters else {})
        return datasets.load_dataset(spec.hub_name, spec.hub_config, split=location, **no_scripts)
    except (ConnectionError, OSError, KeyError, ValueError) as e:
        offline = "offline" in str(e).lower() or "reach" in str(e).lower() or isinstance(e, ConnectionError)
        hint = (
            "The Hub cannot be reached (offline?). Download the corpus where there is a connection "
            "(python -c \"import datasets; datasets.load_dataset(...).save_to_disk('DIR')\") and set "
            "data.hub_name=DIR, or point the config at local files: data=local data.train=PREFIX "
            "data.val=PREFIX data.test=PREFIX (reads PREFIX.{src_lang} and PREFIX.{tgt_lang}), "
            "or data.format=jsonl / tsv with data.train=FILE"
            if offline
            else "Check data.hub_name, data.hub_config and the split name"
        )
        raise CorpusError(
            f"could not load data.{split}={location!r} from dataset {spec.hub_name!r} "
            f"(config {spec.hub_config!r}): {type(e).__name__}: {e}. {hint}"
        ) from e


def _read_hub(spec: CorpusSpec, split: str, stats: ReadStats):
    dataset = load_hub_split(spec, split)
    if "translation" not in dataset.column_names:
        raise CorpusError(
            f"dataset {spec.hub_name!r} split {spec.locations[split]!r} has columns {dataset.column_names}, "
            f"expected a 'translation' column of {{lang: sentence}}"
        )
    for batch in dataset.select_columns(["translation"]).iter(batch_size=CHUNK_PAIRS):
        pairs = batch["translation"]
        missing = [lang for lang in spec.langs if lang not in pairs[0]] if pairs else []
        if missing:
            raise CorpusError(
                f"dataset {spec.hub_name!r} has no language {missing[0]!r} (has {sorted(pairs[0])}); "
                f"check data.src_lang / data.tgt_lang / data.hub_config"
            )
        where = f"dataset {spec.hub_name} split {spec.locations[split]} row"
        first, stats.pairs = stats.pairs, stats.pairs + len(pairs)
        yield tuple([_clean((p[lang] or "").strip(), spec, stats, where, first + i) for i, p in enumerate(pairs)]
                    for lang in spec.langs)


def write_split(spec: CorpusSpec, split: str, path: Path) -> ReadStats:
    """Read a split and write it as an Arrow stream file with one string column per language."""
    schema = pa.schema([(spec.langs[0], pa.large_string()), (spec.langs[1], pa.large_string())])
    stats = ReadStats()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for chunk0, chunk1 in read_pairs(spec, split, stats):
            writer.write_batch(pa.record_batch([pa.array(chunk0, pa.large_string()),
                                                pa.array(chunk1, pa.large_string())], schema=schema))
    if stats.pairs == 0:
        raise CorpusError(f"data.{split}: split is empty (read {', '.join(stats.sources)}); give a split with pairs")
    return stats


def both_sides(raw, langs: tuple[str, str], batch_size: int = 10_000) -> Iterator[str]:
    """Every non-empty sentence of both languages, for training the shared vocabulary."""
    for batch in raw.iter(batch_size=batch_size):
        for lang in langs:
            yield from (s for s in batch[lang] if s)


# --------------------------------------------------------------------------------------------------- filtering


@dataclass
class FilterReport:
    """Pairs dropped from one split, by reason (each pair counted under its first reason)."""

    split: str
    total: int
    empty: int = 0
    too_long: int = 0
    ratio: int = 0
    utf8_replaced_lines: int = 0  # kept, but cleaned while reading (data.utf8_errors=replace)
    control_replaced_sentences: int = 0  # kept, but cleaned while reading (data.control_chars=replace)

    @property
    def kept(self) -> int:
        return self.total - self.empty - self.too_long - self.ratio

    def __str__(self) -> str:
        reasons = [(self.empty, "empty"), (self.too_long, "too long"), (self.ratio, "length ratio")]
        detail = ", ".join(f"{n} {name}" for n, name in reasons if n) or "none dropped"
        cleaned = [(self.utf8_replaced_lines, "lines with invalid UTF-8 replaced by U+FFFD"),
                   (self.control_replaced_sentences, "sentences with control characters replaced by spaces")]
        cleaned = "; ".join(f"{n} {what}" for n, what in cleaned if n)
        return f"{self.split}: filtered {self.total - self.kept} of {self.total} pairs: {detail}" + \
            (f"; cleaned: {cleaned}" if cleaned else "")


def filter_pairs(
    split: str, src_lens: np.ndarray, tgt_lens: np.ndarray, max_positions: int, max_length_ratio: float | None
) -> tuple[np.ndarray, FilterReport]:
    """Indices of the pairs to keep, and why the others were dropped.

    Token lengths exclude bos/eos. A pair is dropped when a side is empty; when a side needs more than
    ``max_positions`` positions (source + eos, bos + target as decoder input); or, if ``max_length_ratio``
    is set, when the longer side has more than that many times the tokens of the shorter.
    """
    src_lens = np.asarray(src_lens, dtype=np.int64)
    tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
    empty = (src_lens == 0) | (tgt_lens == 0)
    too_long = ~empty & (np.maximum(src_lens, tgt_lens) + 1 > max_positions)
    bad_ratio = np.zeros_like(empty)
    if max_length_ratio is not None:
        longer, shorter = np.maximum(src_lens, tgt_lens), np.maximum(np.minimum(src_lens, tgt_lens), 1)
        bad_ratio = ~empty & ~too_long & (longer > max_length_ratio * shorter)
    report = FilterReport(split, len(src_lens), int(empty.sum()), int(too_long.sum()), int(bad_ratio.sum()))
    keep = np.flatnonzero(~(empty | too_long | bad_ratio))
    return keep, report


def file_fingerprint(paths: list[str]) -> list[tuple[str, int, str]]:
    """(absolute path, size, sha256 of the bytes) of local inputs, for cache keys: a file replaced by another of
    the same size and time (``cp -p``, ``rsync -a``) is a new key (``file_digest.content_digest``, memoized in the
    user's cache); hub ids pass through unchanged."""
    out = []
    for p in paths:
        if os.path.exists(p):
            if os.path.isdir(p):  # a saved dataset: fingerprint its files
                out.extend(file_fingerprint(sorted(str(f) for f in Path(p).rglob("*") if f.is_file())))
                continue
            out.append((os.path.abspath(p), os.stat(p).st_size, content_digest(p)))
        else:
            out.append((p, 0, ""))
    return out
