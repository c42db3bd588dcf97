"""BPE-dropout (Provilkov et al. 2020) over a SentencePiece BPE model, drawn from a generator we seed.

SentencePiece's own sampler (``enable_sampling``) draws from a per-thread generator that is not reproducible across
processes (measured with sentencepiece 0.2.3: the same ``set_random_generator_seed`` on a fresh thread gives one
segmentation in a process, another in the next), so a resumed run or a second DDP rank would read a different
epoch. This module replays SentencePiece's BPE encoding (bpe_model.cc) with each merge skipped with probability
``alpha``, the draws from ``random.Random`` seeded per sentence: the same (seed, sentence) gives the same pieces
in every process. With ``alpha=0`` it is SentencePiece's deterministic segmentation (tested on the whole corpus).

The replay: the text normalized by the model (``normalize``: NFKC, whitespace as "▁", the dummy prefix); each
word ("▁" and what follows up to the next "▁": a BPE vocabulary trained with split_by_whitespace holds no piece
across it) starts as its characters; repeatedly the adjacent pair whose concatenation is a piece with the highest
score (the earliest merge), leftmost first, is merged, unless the draw skips it (then that pair is gone until a
neighbour's merge makes it anew); a run of characters that are no piece in the end is one unknown piece (its
text, as SentencePiece returns it). Vocabularies this does not replay are refused: not BPE, byte fallback,
whitespace as a suffix or not splitting at it, unused pieces.
User-defined pieces (the tags of data.train_tags) stay whole wherever the text holds them.
"""

from __future__ import annotations

import heapq
import random
import re

import sentencepiece as spm

BPE, NORMAL, USER_DEFINED, UNUSED = 2, 1, 4, 5  # TrainerSpec.ModelType.BPE; SentencePiece.Type values
WORD_START = "\u2581"


class BpeDropout:
    """``encode(text, rng, alpha)``: one sampled segmentation of ``text`` as piece strings."""

    def __init__(self, model_proto: bytes):
        try:  # imported here: only sampling needs the model's fields (its protobuf module checks its version)
            from sentencepiece import sentencepiece_model_pb2 as model_pb2
        except Exception as error:  # protobuf raises its own VersionError on an older runtime
            raise ValueError(f"cannot read the SentencePiece model's fields for BPE-dropout: {error}") from None
        model = model_pb2.ModelProto()
        model.ParseFromString(model_proto)
        spec = model.trainer_spec
        if spec.model_type != BPE:
            raise ValueError("BPE-dropout needs a BPE SentencePiece vocabulary; this one is "
                             f"{model_pb2.TrainerSpec.ModelType.Name(spec.model_type).lower()} (a vocabulary "
                             "trained here: data.spm_model_type=bpe; an imported one, e.g. a Marian export's, "
                             "cannot be sampled)")
        unsupported = [name for name, on in (("byte_fallback", spec.byte_fallback),
                                             ("treat_whitespace_as_suffix", spec.treat_whitespace_as_suffix),
                                             ("split_by_whitespace=false", not spec.split_by_whitespace),
                                             ("unused pieces", any(p.type == UNUSED for p in model.pieces)))
                       if on]
        if unsupported:
            raise ValueError(f"BPE-dropout here does not replay a vocabulary with {', '.join(unsupported)}")
        # piece -> score: the pieces merges may make (normal and user-defined ones), scored by merge order
        self.scores = {p.piece: p.score for p in model.pieces if p.type in (NORMAL, USER_DEFINED)}
        # user-defined pieces (a tag such as "<BT>") are whole wherever the text holds them, as SentencePiece's
        # prefix matcher makes them: the text is cut around them, and only the rest is merged
        whole = sorted((p.piece for p in model.pieces if p.type == USER_DEFINED), key=len, reverse=True)
        self._whole = re.compile("(" + "|".join(map(re.escape, whole)) + ")") if whole else None
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

    def encode(self, text: str, rng: random.Random, alpha: float) -> list[str]:
        normalized = self._sp.normalize(text)
        if self._whole is None:
            return self._words(normalized, rng, alpha)
        pieces: list[str] = []
        for i, part in enumerate(self._whole.split(normalized)):  # odd parts: the user-defined pieces
            pieces += [part] if i % 2 else self._words(part, rng, alpha)
        return pieces

    def _words(self, normalized: str, rng: random.Random, alpha: float) -> list[str]:
        pieces: list[str] = []
        start = 0
        for end in range(1, len(normalized) + 1):
            if end == len(normalized) or normalized[end] == WORD_START:
                pieces += self._word(normalized[start:end], rng, alpha)
                start = end
        return pieces

    def _word(self, word: str, rng: random.Random, alpha: float) -> list[str]:
        symbols = list(word)  # a symbol per character; merged symbols become "" and link over
        prev = list(range(-1, len(symbols) - 1))
        nxt = list(range(1, len(symbols) + 1))
        nxt[-1] = -1
        agenda: list[tuple[float, int, int, str]] = []  # (-score, left, right, merged): the best pair first

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = symbols[left] + symbols[right]
            score = self.scores.get(merged)
            if score is not None:
                heapq.heappush(agenda, (-score, left, right, merged))

        for i in range(len(symbols) - 1):
            add(i, i + 1)
        while agenda:
            _, left, right, merged = heapq.heappop(agenda)
            if nxt[left] != right or symbols[left] + symbols[right] != merged:
                continue  # a stale pair: one side merged elsewhere since
            if alpha > 0 and rng.random() < alpha:
                continue  # dropped
            symbols[left], symbols[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        pieces: list[str] = []
        for symbol in filter(None, symbols):  # a run of unknown characters is one unknown piece, its surface, as
            if symbol not in self.scores and pieces and pieces[-1] not in self.scores:  # SentencePiece has it
                pieces[-1] += symbol
            else:
                pieces.append(symbol)
        return pieces
