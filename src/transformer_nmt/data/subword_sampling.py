"""Subword regularization on the training side (Kudo 2018; BPE-dropout, Provilkov et al. 2020): each epoch sees
every training sentence in a segmentation drawn anew, while validation and test keep the deterministic one.

``data.spm_alpha`` > 0 turns it on. An epoch's segmentation is a pure function of (seed, epoch, sentence):
BPE-dropout (data/bpe_dropout.py) draws sentence i of the epoch from a generator seeded with (seed, epoch, side,
i), in any process, so a resumed run draws what an uninterrupted one drew, and every rank of a DDP run draws the
same (SentencePiece's own sampler is not used: its generator is not reproducible across processes). The batch
sampler plans each epoch with that epoch's lengths (``SampledSegmentation.widths``), so batches stay within
``data.max_tokens``. A sentence pair whose sampled ids would not fit ``data.max_positions``, or whose padded width
would exceed ``data.max_tokens`` (a sample is longer than its deterministic segmentation, which the batch sampler
checked at set-up: with ``data.max_tokens`` below ``data.max_positions + 1`` a sampled epoch could otherwise hold a
pair wider than the batch limit, and the run would stop mid-epoch), keeps its deterministic ids (counted).

Cost: one pass of BPE-dropout in Python over the training text per epoch (Multi30k's 29k pairs: about 2 seconds
a side), kept in memory as ragged arrays. A pair kept by the filter stays kept: the filter runs once, on the
deterministic ids.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence

import numpy as np

from transformer_nmt.data.batching import pair_widths
from transformer_nmt.data.language_tags import led_by
from transformer_nmt.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Ragged = tuple[np.ndarray, np.ndarray]  # (flat ids, offsets of n + 1 rows)


def epoch_seed(seed: int, epoch: int) -> int:
    """An epoch's base seed (each sentence's draws are seeded from it and the sentence's index): a hash of
    (seed, epoch), a 32-bit number."""
    digest = hashlib.sha256(f"subword-sampling/{seed}/{epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "little") or 1


def side_seed(seed: int, epoch: int, target: bool) -> int:
    """The seed of one side's draws in an epoch: the epoch's base seed, the target side's set apart."""
    return epoch_seed(seed, epoch) ^ (0x5EED if target else 0)


def _ragged(rows: Sequence[Sequence[int]]) -> Ragged:
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for row in rows for i in row), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


class SampledSegmentation:
    """The training split's sampled token ids, one epoch at a time (see the module doc).

    ``sources``/``targets``: the kept pairs' raw sentences, in the filtered split's order; ``fallback``: their
    deterministic ids ((src Ragged, tgt Ragged)), used where a sample is too long for ``max_positions`` or wider
    (``batching.pair_widths``) than ``max_width`` (the widest pair a batch may hold: data.max_tokens, rounded down to
    data.pad_to_multiple; None: no bound);
    ``source_tags``: (n,) the id each source starts with (its corpus's tag, data.train_tags), -1 for none.
    """

    def __init__(self, tokenizer: Tokenizer, sources: list[str], targets: list[str], alpha: float, seed: int,
                 max_positions: int, fallback: tuple[Ragged, Ragged], source_tags: np.ndarray | None = None,
                 max_width: int | None = None):
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"data.spm_alpha={alpha}: give a probability in (0, 1), or 0 for no sampling")
        for target in (False, True):  # refused now, not when the first epoch is drawn
            try:
                tokenizer.bpe_dropout(target)
            except ValueError as error:
                raise ValueError(f"data.spm_alpha={alpha}: {error}") from None
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} source but {len(targets)} target sentences")
        self.tokenizer, self.sources, self.targets = tokenizer, sources, targets
        self.alpha, self.seed, self.max_positions, self.max_width = alpha, seed, max_positions, max_width
        self.fallback, self.source_tags = fallback, source_tags
        # epoch -> ((source ids, target ids), widths): the epoch being read and the one the batch sampler may plan
        # ahead (batching.TokenBucketBatchSampler._plan_ahead), never more
        self._epochs: dict[int, tuple[tuple[Ragged, Ragged], np.ndarray]] = {}
        self.fallbacks: dict[int, int] = {}  # per epoch: pairs that kept their deterministic ids
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.sources)

    def _build(self, epoch: int) -> tuple[tuple[Ragged, Ragged], np.ndarray]:
        src = self.tokenizer.encode_sampled(self.sources, self.alpha, side_seed(self.seed, epoch, False), target=False)
        if self.source_tags is not None:  # the tag is one piece, never sampled: it leads as in the fixed ids
            src = [ids if tag < 0 else led_by(int(tag), ids) for tag, ids in zip(self.source_tags.tolist(), src)]
        tgt = self.tokenizer.encode_sampled(self.targets, self.alpha, side_seed(self.seed, epoch, True), target=True)
        too_long = 0
        (s_flat, s_off), (t_flat, t_off) = self.fallback
        widest = self.max_width if self.max_width is not None else float("inf")
        for i in range(len(src)):  # source + eos and bos + target must fit the positions, as the filter says,
            # and source + eos, bos + target + eos the batch limit, as the batch sampler checked the deterministic ids
            if max(len(src[i]), len(tgt[i])) + 1 > self.max_positions or max(len(src[i]) + 1,
                                                                               len(tgt[i]) + 2) > widest:
                src[i] = s_flat[s_off[i]:s_off[i + 1]].tolist()
                tgt[i] = t_flat[t_off[i]:t_off[i + 1]].tolist()
                too_long += 1
        ids = (_ragged(src), _ragged(tgt))
        self.fallbacks[epoch] = too_long
        if too_long:
            log.info("subword sampling, epoch %d: %d sentence pair(s) kept their deterministic ids (a sample was "
                     "longer than data.max_positions or wider than data.max_tokens)", epoch, too_long)
        return ids, pair_widths(np.diff(ids[0][1]), np.diff(ids[1][1]))

    def _get(self, epoch: int) -> tuple[tuple[Ragged, Ragged], np.ndarray]:
        with self._lock:
            if epoch not in self._epochs:
                self._epochs[epoch] = self._build(epoch)
                while len(self._epochs) > 2:  # the oldest other epoch goes (not the one asked for: an earlier one)
                    del self._epochs[min(e for e in self._epochs if e != epoch)]
            return self._epochs[epoch]

    def epoch(self, epoch: int) -> tuple[Ragged, Ragged]:
        """(source ids, target ids) of every kept pair in ``epoch``'s segmentation, as ragged arrays."""
        return self._get(epoch)[0]

    def widths(self, epoch: int) -> np.ndarray:
        """(n,) padded width of every kept pair in ``epoch``'s segmentation (``batching.pair_widths``)."""
        return self._get(epoch)[1]


def take_rows(ragged: Ragged, rows: Sequence[int]) -> Ragged:
    """The ``rows`` of a ragged array, as a ragged batch (values, offsets from 0), in the order given."""
    flat, offsets = ragged
    rows = np.asarray(rows, dtype=np.int64)
    starts, ends = offsets[rows], offsets[rows + 1]
    lengths = ends - starts
    out_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    # every token's position in flat: its row's start + its place in the row
    positions = np.repeat(starts - out_offsets[:-1], lengths) + np.arange(int(out_offsets[-1]))
    return flat[positions], out_offsets
