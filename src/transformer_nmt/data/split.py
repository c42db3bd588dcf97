"""``Split``: one prepared split of the datamodule (raw sentences, token ids, the pairs that survive filtering),
shared by the one-pair set-up (data/datamodule.py) and the multilingual one (data/multilingual.py)."""

from __future__ import annotations

from dataclasses import dataclass

import datasets
import numpy as np

from transformer_nmt.data.corpus import FilterReport
from transformer_nmt.data.pair_sampling import EpochDraw


@dataclass
class Split:
    """One prepared split: raw sentences, token ids, and which pairs survive filtering."""

    name: str
    raw: datasets.Dataset  # columns {lang}: string
    tokens: datasets.Dataset  # columns {lang}_ids: list<int32>, {lang}_len: int32
    keep: np.ndarray  # (n_kept,) row of the raw/token tables for each filtered index (memory-mapped)
    widths: np.ndarray  # (n_kept,) padded width of each filtered pair, batching.pair_widths (memory-mapped)
    report: FilterReport
    tokenized_now: bool  # False when the token ids came from the cache
    source_tags: np.ndarray | None = None  # (n_kept,) the tag id each source starts with, -1: none (data.train_tags)
    pair_of: np.ndarray | None = None  # (n_kept,) each pair's direction, an index into data.pairs (None: one pair)
    draw: EpochDraw | None = None  # data.pairs' temperature sampling: each epoch's members of ``keep``; None: all

    @property
    def epoch_pairs(self) -> int:
        """How many pairs an epoch holds (``len(keep)`` unless temperature sampling draws them)."""
        return len(self.keep) if self.draw is None else sum(self.draw.counts)

    def lengths(self, lang: str) -> np.ndarray:
        return self.tokens.data.column(f"{lang}_len").to_numpy()[self.keep]
