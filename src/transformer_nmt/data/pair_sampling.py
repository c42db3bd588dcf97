"""Temperature-based sampling across the pairs of a multilingual run (``data.pair_temperature``; Arivazhagan et
al. 2019): pair i, with n_i pairs, enters an epoch with probability p_i = n_i^(1/T) / sum_j n_j^(1/T), so T=1 is
proportional to size (each pair once, as plain concatenation) and a larger T flattens the shares toward uniform.

An epoch holds as many pairs as the corpora together (sum n_i): pair i contributes round(p_i * sum n_i) of them
(largest remainders, so the counts add up exactly): its kept pairs whole as many times as fit, then a subset drawn
without replacement from a generator seeded by (seed, epoch, pair index). The draw is made anew each epoch
(``EpochDraw.members``), so a subsampled pair shows other members each epoch instead of one subset for the whole
run; it is a pure function of (seed, epoch), so a resumed run (or another rank) draws what an uninterrupted one
drew. The training split's ``Split.keep`` holds every kept pair once (the pool); the batch sampler plans each epoch
over that epoch's members and deals their indices into the pool. Where no pair is drawn from (T=1, or pairs of
equal size) there is no draw and the epoch is the pool, as for one corpus.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def temperature_shares(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """(n_pairs,) float64: each pair's share of an epoch, p_i proportional to n_i^(1/T)."""
    if not temperature > 0:
        raise ValueError(f"data.pair_temperature={temperature}: give a temperature > 0")
    n = np.asarray(sizes, dtype=np.float64)
    if n.ndim != 1 or len(n) == 0 or (n <= 0).any():
        raise ValueError(f"every pair needs at least one training pair, got sizes {list(sizes)}")
    weights = n ** (1.0 / temperature)
    return weights / weights.sum()


def epoch_counts(sizes: Sequence[int], temperature: float) -> list[int]:
    """How many rows of each pair an epoch holds: sum(sizes) in all, split by ``temperature_shares`` (largest
    remainders; T=1 gives ``sizes`` exactly)."""
    total = int(sum(sizes))
    if temperature == 1:
        return [int(n) for n in sizes]
    quotas = temperature_shares(sizes, temperature) * total
    counts = np.floor(quotas).astype(np.int64)
    for i in np.argsort(-(quotas - counts), kind="stable")[: total - int(counts.sum())]:
        counts[i] += 1
    return counts.tolist()


def epoch_rows(n: int, count: int, seed: int, epoch: int, pair_index: int) -> np.ndarray:
    """(count,) int64 positions in 0..n-1: every position count // n times, then count % n distinct ones drawn
    from a generator seeded with (seed, epoch, pair_index), in ascending order."""
    whole, rest = divmod(count, n)
    drawn = np.sort(np.random.default_rng([seed, epoch, pair_index]).choice(n, size=rest, replace=False))
    return np.concatenate([np.tile(np.arange(n, dtype=np.int64), whole), drawn.astype(np.int64)])


@dataclass(frozen=True)
class EpochDraw:
    """Which pairs of the pool (each direction's kept pairs once, in data.pairs order: ``sizes[i]`` of direction i)
    make up each epoch: ``counts[i]`` of direction i, drawn anew per epoch (see the module docstring)."""

    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    seed: int

    def members(self, epoch: int) -> np.ndarray:
        """(sum(counts),) int64 positions in the pool: epoch ``epoch``'s pairs, direction by direction."""
        starts = np.cumsum((0, *self.sizes[:-1]))
        return np.concatenate([start + epoch_rows(n, count, self.seed, epoch, i)
                               for i, (start, n, count) in enumerate(zip(starts, self.sizes, self.counts))])


def epoch_draw(sizes: Sequence[int], temperature: float, seed: int) -> EpochDraw | None:
    """The per-epoch draw of pairs of these sizes at this temperature; None where every epoch is the whole pool."""
    counts = epoch_counts(sizes, temperature)
    if counts == [int(n) for n in sizes]:
        return None
    return EpochDraw(tuple(int(n) for n in sizes), tuple(counts), seed)
