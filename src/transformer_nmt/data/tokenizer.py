"""A shared SentencePiece subword vocabulary (paper section 5.1: "a shared source-target vocabulary"), or an
imported model's separate source and target SentencePiece models over one joint vocabulary (``Tokenizer``).

The paper used byte-pair encoding with 37,000 tokens for English-German. We train a SentencePiece
model (BPE or unigram) on both sides of the training split, with fixed special ids:

    pad_id = 0, unk_id = 1, bos_id = 2, eos_id = 3

``encode`` returns subword ids without bos/eos; the batch collator adds them. ``tokenize_dataset``
tokenizes a split of raw pairs with a batched, multi-process ``datasets.map``.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import sentencepiece as spm

from transformer_nmt.data.bpe_dropout import BpeDropout

if TYPE_CHECKING:
    import pyarrow as pa

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Tokenizer:
    """A SentencePiece model with the special ids above.

    The shared vocabulary of a run is one SentencePiece model whose ids are the model's. An imported model
    (interchange/marian.py) may instead bring separate source and target SentencePiece models over one joint
    vocabulary: ``target_proto`` splits the target side's text, and ``pieces`` (the vocabulary, in id order,
    pad/unk/bos/eos first) maps pieces to ids. Text -> pieces by the side's SentencePiece model -> ids by
    ``pieces`` (a piece outside it: unk), as MarianTokenizer does; ids -> pieces -> the target model's text.
    Without ``pieces`` the ids are the SentencePiece model's own (the shared case, unchanged).
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_proto: bytes, target_proto: bytes | None = None, pieces: list[str] | None = None):
        self._proto = bytes(model_proto)
        self._target_proto = None if target_proto is None else bytes(target_proto)
        self._pieces = None if pieces is None else [str(piece) for piece in pieces]
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        self._target_sp = (self._sp if self._target_proto is None
                           else spm.SentencePieceProcessor(model_proto=self._target_proto))
        self._dropout: dict[bytes, BpeDropout] = {}  # a side's model -> its BPE-dropout, built when first sampled
        if self._pieces is None:
            if self._target_proto is not None:
                raise ValueError("a target SentencePiece model needs the joint vocabulary (pieces) that maps "
                                 "both models' pieces to ids")
            ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
            if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
                raise ValueError(f"SentencePiece model has pad/unk/bos/eos ids {ids}, expected (0, 1, 2, 3)")
            return
        if len(self._pieces) <= EOS_ID or len(set(self._pieces)) != len(self._pieces):
            raise ValueError(f"the vocabulary must hold distinct pieces, pad/unk/bos/eos first; got "
                             f"{len(self._pieces)} pieces, {len(set(self._pieces))} distinct")
        self._ids = {piece: i for i, piece in enumerate(self._pieces)}

    @classmethod
    def from_proto(cls, model_proto: bytes) -> Tokenizer:
        return cls(model_proto)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        return cls(Path(path).read_bytes())

    def save(self, path: str | os.PathLike) -> None:
        if not self.single_file:
            raise ValueError(f"cannot save this tokenizer as one SentencePiece model ({path}): it has separate "
                             "source and target models or an imported vocabulary")
        Path(path).write_bytes(self._proto)

    @property
    def model_proto(self) -> bytes:
        """The serialized (source) SentencePiece model, to embed in checkpoints."""
        return self._proto

    @property
    def target_proto(self) -> bytes | None:
        """The target side's serialized SentencePiece model; None: the source's."""
        return self._target_proto

    @property
    def pieces(self) -> list[str] | None:
        """The joint vocabulary in id order; None: the SentencePiece model's ids."""
        return None if self._pieces is None else list(self._pieces)

    @property
    def identity(self) -> tuple[bytes, bytes | None, tuple[str, ...] | None]:
        """Everything that maps text to ids and back: the (source) SentencePiece model, the target one, the joint
        vocabulary. Two tokenizers with equal identities encode and decode alike; models that share ids (an
        ensemble, an average) must share it whole, not only the source model."""
        return self._proto, self._target_proto, None if self._pieces is None else tuple(self._pieces)

    @property
    def single_file(self) -> bool:
        """One SentencePiece model whose ids are the model's (what every run trains)."""
        return self._target_proto is None and self._pieces is None

    def digest(self) -> str:
        """A hash of everything that decides the ids (a cache key): the model's sha256 when it is a single file."""
        if self.single_file:
            return hashlib.sha256(self._proto).hexdigest()
        parts = [self._proto, self._target_proto or b"", "\n".join(self._pieces).encode()]
        return hashlib.sha256(b"\0".join(hashlib.sha256(part).digest() for part in parts)).hexdigest()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size() if self._pieces is None else len(self._pieces)

    def _sentencepiece(self, target: bool) -> spm.SentencePieceProcessor:
        return self._target_sp if target else self._sp

    def _to_ids(self, pieces: list[str]) -> list[int]:
        return [self._ids.get(piece, UNK_ID) for piece in pieces]

    def encode(self, text: str, target: bool = False) -> list[int]:
        """Subword ids of ``text`` (no bos/eos); ``target``: split it as the target side does."""
        return self.encode_batch([text], target=target)[0]

    def encode_batch(self, texts: list[str], num_threads: int = 1, target: bool = False) -> list[list[int]]:
        """Encode many sentences at once; the loop runs in C++ on ``num_threads`` threads."""
        sp = self._sentencepiece(target)
        if self._pieces is None:
            return sp.encode(texts, num_threads=num_threads)
        return [self._to_ids(pieces) for pieces in sp.encode(texts, out_type=str, num_threads=num_threads)]

    def bpe_dropout(self, target: bool = False) -> BpeDropout:
        """The side's BPE-dropout sampler (built once); ValueError for a model it cannot sample (not BPE)."""
        side = (self._target_proto if target else None) or self._proto
        if side not in self._dropout:
            self._dropout[side] = BpeDropout(side)
        return self._dropout[side]

    def encode_sampled(self, texts: list[str], alpha: float, seed: int, target: bool = False) -> list[list[int]]:
        """One sampled segmentation of each sentence (subword regularization): BPE-dropout with merge-drop
        probability ``alpha`` (data/bpe_dropout.py; a BPE model only), the draws for sentence i from a generator
        seeded with (``seed``, i), so the result is the same in every process."""
        dropout = self.bpe_dropout(target)
        sampled = [dropout.encode(text, random.Random(f"{seed}/{i}"), alpha) for i, text in enumerate(texts)]
        if self._pieces is None:
            sp = self._sentencepiece(target)
            known = dropout.scores  # an unknown run's text is the unknown id, whatever piece it spells
            return [[sp.piece_to_id(piece) if piece in known else UNK_ID for piece in pieces] for pieces in sampled]
        return [self._to_ids(pieces) for pieces in sampled]

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text (the target side's); special ids (pad, bos, eos) are dropped."""
        kept = [int(i) for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)]
        if self._pieces is None:
            return self._sp.decode(kept)
        unknown = self._target_sp.id_to_piece(self._target_sp.unk_id())  # decodes to " \u2047 ", as above
        return self._target_sp.decode_pieces([unknown if i == UNK_ID else self._pieces[i] for i in kept])

    def surfaces(self, ids: list[int]) -> list[str]:
        """The text each id adds to ``decode(ids)``, so that their concatenation is that text: "" for the special
        ids decode drops, SentencePiece's " \u2047 " (space, "⁇", space) for an unknown piece, a space for "▁".
        Byte pieces (byte fallback) that only together make a character: the last of them adds it, the others ""
        (a prefix ending inside a character decodes to a replacement character that the whole text does not hold:
        each prefix counts only as far as it agrees with the whole text)."""
        texts = [self.decode(ids[:k]) for k in range(len(ids) + 1)]  # each prefix's text
        whole = texts[-1]
        ends = list(accumulate((len(os.path.commonprefix([text, whole])) for text in texts), max))
        return [whole[start:end] for start, end in zip(ends, ends[1:])]

    def piece_id(self, piece: str) -> int | None:
        """The id of ``piece`` in the vocabulary, None where it is not one of its pieces (or is unk's)."""
        token_id = self._sp.piece_to_id(piece) if self._pieces is None else self._ids.get(piece, UNK_ID)
        return None if token_id == UNK_ID or self.id_to_piece(token_id) != piece else token_id

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id)) if self._pieces is None else self._pieces[int(token_id)]

    def __eq__(self, other) -> bool:
        return isinstance(other, Tokenizer) and self.__getstate__() == other.__getstate__()

    __hash__ = None

    def __getstate__(self):  # for DataLoader workers and datasets.map processes
        return {"proto": self._proto, "target_proto": self._target_proto, "pieces": self._pieces}

    def __setstate__(self, state):
        self.__init__(state["proto"], state.get("target_proto"), state.get("pieces"))


def train_sentencepiece(
    sentences: Iterator[str],
    vocab_size: int,
    model_type: str = "bpe",
    input_sentence_size: int = 2_000_000,
    character_coverage: float = 1.0,
    seed: int = 0,
    num_threads: int = 1,
    user_defined_symbols: Sequence[str] = (),
) -> Tokenizer:
    """Train a shared vocabulary on an iterator of sentences (both languages).

    When there are more than ``input_sentence_size`` sentences, SentencePiece trains on a uniform sample
    of that many (reservoir sampling while streaming), so memory is bounded by the sample, not the corpus.
    ``vocab_size`` is an upper bound: a corpus too small for it yields a smaller vocabulary.
    ``user_defined_symbols``: pieces the vocabulary holds whole wherever they occur (a source tag, data.train_tags).
    """
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"data.spm_model_type={model_type!r}: use 'bpe' or 'unigram'")
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        hard_vocab_limit=False,
        num_threads=num_threads,
        minloglevel=2,
        **({"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}),
    )
    return Tokenizer(model.getvalue())


class _EncodeColumns:
    """The function ``datasets.map`` runs on each batch (an Arrow table): one id column per language."""

    def __init__(self, tokenizer: Tokenizer, langs: tuple[str, ...], num_threads: int):
        self.tokenizer, self.langs, self.num_threads = tokenizer, langs, num_threads

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow as pa  # here: translate loads a Tokenizer, and pyarrow would cost its cold start 70 ms

        columns = {}
        for lang in self.langs:
            ids = self.tokenizer.encode_batch(batch.column(lang).to_pylist(), self.num_threads,
                                              target=lang != self.langs[0])  # langs: (source, target)
            lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
            offsets = np.zeros(len(ids) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
            columns[f"{lang}_ids"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
            columns[f"{lang}_len"] = pa.array(lengths)
        return pa.table(columns)


def tokenize_dataset(raw, tokenizer: Tokenizer, langs: tuple[str, ...], cache_file: Path, num_proc: int = 1,
                     batch_size: int = 2_000):
    """Tokenize the string columns ``langs`` of a raw split into ``{lang}_ids`` and ``{lang}_len`` columns.

    Runs ``datasets.map`` (batched, ``num_proc`` processes) writing Arrow files next to ``cache_file``
    (one per process); returns the memory-mapped result.
    """
    num_proc = max(1, min(num_proc, len(raw) // 10_000))  # a process is worth starting for >= 10k pairs
    threads = max(1, len(os.sched_getaffinity(0)) // num_proc) if hasattr(os, "sched_getaffinity") else 1
    return raw.with_format("arrow").map(
        _EncodeColumns(tokenizer, langs, threads),
        batched=True,
        batch_size=batch_size,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=list(raw.column_names),
        cache_file_name=str(cache_file),
        load_from_cache_file=False,
        desc="tokenizing",
    ).with_format(None)
