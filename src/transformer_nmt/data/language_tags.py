"""Language tags: the one rule that turns (text, source language, target language) into the ids a model trained on
several directions reads (``data.pairs``), so that training, validation, translate, evaluate and the exports
cannot disagree.

Three styles (``data.lang_tags``); each tag is one user-defined piece of the shared SentencePiece vocabulary:

    target   (default; Johnson et al. 2017)   source: <2de> x ... </s>      decoder: <s> y ... </s>
    source   (many-to-one only)               source: <en> x ... </s>       decoder: <s> y ... </s>
    decoder  (as mBART / NLLB)                source: <en> x ... </s>       decoder: <s> <de> y ... </s>

``target`` names the output's language on the source side; ``source`` names the input's, which suffices only where
every pair has the same target language; ``decoder`` names the input's on the source side and forces the output's
as the first target token (a prefix at inference, CTranslate2's ``target_prefix``), which is stripped from the
output. A model trained on one pair (``data.pairs`` unset) has no tags: ``LanguageTags.of`` gives None for it and
its ids are exactly as before.

Every tag, a language's or a corpus's (``data.train_tags``: ``<BT>`` before back-translated sources), is put in
by the one rule here, ``led_by`` (``LeadWith`` applies it to a cached Arrow column), and checked absent from the
text by ``tag_in_text``: training, validation, translate, evaluate, synthesize, explore, analyze_heads, the
ensembles and the exports all read their tagged ids through this module (``Direction.encode``), the commands
choosing the direction through inference/directions.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STYLES = ("target", "source", "decoder")
LANGUAGE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,15}")  # a language code: en, de, pt_BR, deu_Latn


def parse_pair(text: Any, option: str = "data.pairs") -> tuple[str, str]:
    """``"en-de"`` -> ``("en", "de")``; a ``ValueError`` naming ``option`` for anything else."""
    parts = text.split("-") if isinstance(text, str) else []
    if len(parts) != 2 or not all(LANGUAGE.fullmatch(p) and p not in ("src", "tgt") for p in parts) \
            or parts[0] == parts[1]:
        raise ValueError(f"{option}: {text!r:.60} is not a pair SRC-TGT of two different language codes (letters, "
                         f"digits, _), e.g. en-de")
    return parts[0], parts[1]


def parse_pairs(values: Any, option: str = "data.pairs") -> list[tuple[str, str]]:
    """The directions ``data.pairs`` lists (``[en-de,en-fr]``), in order, each once."""
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{option}={values!r:.80}: give a list of pairs, e.g. [en-de,en-fr,en-cs]")
    pairs = [parse_pair(v, option) for v in values]
    if len(set(pairs)) != len(pairs):
        raise ValueError(f"{option}={list(values)}: a pair is listed twice")
    return pairs


def pair_name(src: str, tgt: str) -> str:
    return f"{src}-{tgt}"


@dataclass(frozen=True)
class LanguageTags:
    """The directions a model knows and how their tags are spelled (see the module docstring)."""

    pairs: tuple[tuple[str, str], ...]
    style: str = "target"

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"data.lang_tags={self.style!r}: use one of {', '.join(STYLES)}")
        if self.style == "source" and len({t for _, t in self.pairs}) > 1:
            raise ValueError(f"data.lang_tags=source names only the input's language, but data.pairs has several "
                             f"target languages ({', '.join(sorted({t for _, t in self.pairs}))}): use target or "
                             f"decoder")

    @classmethod
    def of(cls, data_config: Mapping[str, Any] | None) -> LanguageTags | None:
        """The tags of a model whose data config (a ``DataConfig`` or a checkpoint's record) is given; None for a
        one-pair model (no ``pairs``: an old checkpoint, or any run without data.pairs)."""
        if data_config is None:
            return None
        get = data_config.get if isinstance(data_config, Mapping) else lambda k, d=None: getattr(data_config, k, d)
        pairs = get("pairs")
        if not pairs:
            return None
        return cls(tuple(parse_pairs(list(pairs))), get("lang_tags") or "target")

    # ---------------------------------------------------------------------------------------------- pieces

    def source_piece(self, src: str, tgt: str) -> str:
        """The piece that leads the source ids of direction src -> tgt."""
        return f"<2{tgt}>" if self.style == "target" else f"<{src}>"

    def decoder_piece(self, tgt: str) -> str | None:
        """The piece forced as the first target token (style decoder), None otherwise."""
        return f"<{tgt}>" if self.style == "decoder" else None

    def pieces(self) -> list[str]:
        """Every tag piece the directions use: the vocabulary's user-defined symbols."""
        found = {self.source_piece(s, t) for s, t in self.pairs}
        found |= {p for _, t in self.pairs if (p := self.decoder_piece(t))}
        return sorted(found)

    def piece_ids(self, tokenizer, pieces: list[str]) -> list[int]:
        """Each piece's id; a ``ValueError`` where the vocabulary does not hold one as a single piece."""
        ids = []
        for piece in pieces:
            token_id = tokenizer.piece_id(piece)
            if token_id is None:
                raise ValueError(f"language tag {piece!r} is not a piece of the vocabulary: train it with the tags "
                                 f"(data.tokenizer_path=null), or give one holding them as user-defined symbols")
            ids.append(token_id)
        return ids

    # ---------------------------------------------------------------------------------------------- directions

    def languages(self) -> tuple[list[str], list[str]]:
        """(source languages, target languages) in the order data.pairs first names them."""
        return (list(dict.fromkeys(s for s, _ in self.pairs)), list(dict.fromkeys(t for _, t in self.pairs)))

    def direction(self, src: str | None, tgt: str | None, zero_shot: bool = False) -> Direction:
        """The direction src -> tgt: each may be left out where the pairs leave one choice; a direction the model was
        not trained on is refused naming those it knows, or with ``zero_shot`` allowed (and so labelled) where its
        tags exist."""
        known = ", ".join(pair_name(*p) for p in self.pairs)
        sources, targets = self.languages()
        if src is None:
            choices = sorted({s for s, t in self.pairs if tgt in (None, t)}) or sorted(sources)
            if len(choices) != 1:
                raise ValueError(f"give src_lang= (one of {', '.join(choices)}): the model knows {known}")
            src = choices[0]
        if tgt is None:
            choices = sorted({t for s, t in self.pairs if s == src})
            if len(choices) != 1:
                raise ValueError(f"give tgt_lang= (one of {', '.join(choices or targets)}): the model knows {known}")
            tgt = choices[0]
        if (src, tgt) in self.pairs:
            return Direction(self, src, tgt, zero_shot=False)
        if not zero_shot:
            raise ValueError(f"the model was not trained on {pair_name(src, tgt)}; it knows {known} (zero_shot=true "
                             f"translates an untrained direction whose tags it has)")
        every = set(sources) | set(targets)
        if src == tgt or tgt not in targets or (self.style != "target" and src not in every):
            raise ValueError(f"{pair_name(src, tgt)} cannot be tried zero-shot: the model has no tag for "
                             f"{tgt if tgt not in targets else src}; it knows {known}")
        return Direction(self, src, tgt, zero_shot=True)


@dataclass(frozen=True)
class Direction:
    """One direction of a tagged model: the source ids it reads and the target prefix it starts from."""

    tags: LanguageTags
    src: str
    tgt: str
    zero_shot: bool = False

    @property
    def name(self) -> str:
        return pair_name(self.src, self.tgt)

    def source_tag(self, tokenizer) -> int:
        return self.tags.piece_ids(tokenizer, [self.tags.source_piece(self.src, self.tgt)])[0]

    def decoder_prefix(self, tokenizer) -> list[int]:
        """The target ids every output starts with (style decoder: its tag), stripped from the output."""
        piece = self.tags.decoder_piece(self.tgt)
        return [] if piece is None else self.tags.piece_ids(tokenizer, [piece])

    def encode(self, tokenizer, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """The rule: each text's source ids, led by the direction's tag (no eos)."""
        tag = self.source_tag(tokenizer)
        return [led_by(tag, ids) for ids in tokenizer.encode_batch(texts, num_threads)]

    def strip(self, tokens: list[int], prefix: list[int]) -> list[int]:
        """An output's target ids without the forced decoder tag."""
        return tokens[len(prefix):] if prefix and tokens[: len(prefix)] == prefix else tokens

    def record(self) -> dict[str, Any]:
        """What an output's record says of the direction."""
        return {"src_lang": self.src, "tgt_lang": self.tgt, "zero_shot": self.zero_shot}


# -------------------------------------------------------------------------------------------------- the rule


def led_by(tag_id: int, ids: list[int]) -> list[int]:
    """The rule every tag follows, a corpus's (data.train_tags) or a language's: one piece before the ids."""
    return [tag_id, *ids]


class LeadWith:
    """``led_by`` over a column: what ``datasets.map`` runs on each batch (an Arrow table) of a tagged corpus
    (data.train_tags, data.pairs' tags): ``tag_id`` before every row of ``ids_column``, ``len_column`` one more."""

    def __init__(self, tag_id: int, ids_column: str, len_column: str):
        self.tag_id, self.ids_column, self.len_column = tag_id, ids_column, len_column

    def __call__(self, batch):
        import pyarrow as pa
        import pyarrow.compute as pc

        ids = batch.column(self.ids_column).combine_chunks()
        offsets = ids.offsets.to_numpy().astype(np.int64)
        flat = ids.flatten().to_numpy()
        lengths = np.diff(offsets)
        new_offsets = offsets - offsets[0] + np.arange(len(lengths) + 1)  # one more id per row
        out = np.empty(int(new_offsets[-1]), dtype=flat.dtype)
        out[new_offsets[:-1]] = self.tag_id
        mask = np.ones(len(out), dtype=bool)
        mask[new_offsets[:-1]] = False
        out[mask] = flat
        columns = {name: batch.column(name) for name in batch.column_names}
        columns[self.ids_column] = pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), pa.array(out))
        columns[self.len_column] = pc.add(batch.column(self.len_column), 1).cast(pa.int32())
        return pa.table(columns)


def tag_in_text(text, pieces: list[str]) -> str | None:
    """The first of ``pieces`` that occurs in ``text`` (an Arrow string column), None if none: a tag must be a
    token no sentence holds, or it would be cut out of every word holding it. Compared after NFKC normalization, as
    SentencePiece matches pieces (its ``nmt_nfkc``: ``＜BT＞`` is ``<BT>`` there)."""
    import pyarrow.compute as pc

    normalized = pc.utf8_normalize(text, form="NFKC")
    return next((p for p in pieces if pc.any(pc.match_substring(normalized, p)).as_py()), None)
