"""Batching by tokens (paper section 5.1: "each training batch contained a set of sentence pairs
containing approximately 25000 source tokens and 25000 target tokens").

``TokenBucketBatchSampler`` groups pairs of similar length so that each batch, once padded, holds at
most ``max_tokens`` source tokens and at most ``max_tokens`` target tokens (fairseq's ``--max-tokens``):
with n pairs, source width S (tokens + eos) and target width T (bos + tokens + eos), n*S <= max_tokens
and n*T <= max_tokens. ``pad_pairs`` turns a batch of token ids into the padded tensors the model eats.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from transformer_nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID


def pair_widths(src_lens: np.ndarray, tgt_lens: np.ndarray) -> np.ndarray:
    """Padded width each pair needs: max(source + eos, bos + target + eos)."""
    return np.maximum(np.asarray(src_lens, dtype=np.int64) + 1, np.asarray(tgt_lens, dtype=np.int64) + 2)


def pack_sorted(widths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Greedily cut positions 0..n-1 of ascending ``widths`` into runs with count * last width <= max_tokens.

    Widths ascend, so a run's padded width is its last width and ``count * width`` grows along the run:
    the longest admissible run from ``start`` is found by binary search.
    """
    n = len(widths)
    runs, start = [], 0
    while start < n:
        counts = np.arange(1, n - start + 1)  # run length if it ended at each position
        fits = counts * widths[start:] <= max_tokens  # True...True False...False
        end = start + max(1, int(np.searchsorted(~fits, True)))
        runs.append(np.arange(start, end))
        start = end
    return runs


class TokenBucketBatchSampler:
    """Length-bucketed batches of pair indices, bounded by ``max_tokens`` padded tokens per side.

    - Shuffled per epoch from ``seed + epoch`` (ties in length broken at random, then batch order
      shuffled); without ``shuffle``, batches are in length order. Same seed and epoch, same batches.
    - DDP: rank r of R takes batches r, r+R, r+2R, ... of the epoch's list. So that every rank gets the
      same number, the list is first made a multiple of R by splitting the largest batches in two
      (a half batch still respects ``max_tokens``); only if there are fewer pairs than ranks are
      batches repeated, and ``padded_batches`` counts those repeats.
    - ``set_epoch(e)`` selects the epoch; after a complete pass the epoch advances by itself.
      ``state_dict()`` / ``load_state_dict()`` hold (epoch, batches already yielded) so that a run
      resumed mid-epoch skips the batches it consumed.
    """

    def __init__(self, src_lens, tgt_lens, max_tokens: int, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0, pad_to_multiple: int = 1):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.widths = -(-pair_widths(src_lens, tgt_lens) // pad_to_multiple) * pad_to_multiple  # as pad_pairs pads
        if len(self.widths) and self.widths.max() > max_tokens:
            raise ValueError(
                f"data.max_tokens={max_tokens} is smaller than the longest pair ({self.widths.max()} padded tokens "
                f"with bos/eos): raise data.max_tokens or lower data.max_positions"
            )
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self.padded_batches = 0  # batches repeated in the last epoch built, so that all ranks have as many
        self._skip = 0  # batches of self.epoch already consumed (set by load_state_dict)
        self._yielded = 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    @property
    def sampler(self):
        """Lightning sets the epoch through ``dataloader.batch_sampler.sampler.set_epoch``."""
        return self

    @property
    def pending_skip(self) -> int:
        """Batches the next iteration will skip (restored from a checkpoint)."""
        return self._skip

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._skip = epoch, 0

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """All batches of an epoch, over all ranks, in the order they are dealt out."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, epoch])
        if self.shuffle:
            order = rng.permutation(len(self.widths))
            order = order[np.argsort(self.widths[order], kind="stable")]  # by width, ties in random order
        else:
            order = np.argsort(self.widths, kind="stable")
        batches = [order[run] for run in pack_sorted(self.widths[order], self.max_tokens)]
        batches = self._equalize(batches)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (epoch, batches)
        return batches

    def _equalize(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """Make the number of batches a multiple of the number of ranks, splitting before repeating."""
        short = -len(batches) % self.num_replicas
        self.padded_batches = 0
        while short and any(len(b) > 1 for b in batches):
            largest = max(range(len(batches)), key=lambda i: len(batches[i]))
            b = batches.pop(largest)
            half = len(b) // 2
            batches[largest:largest] = [b[:half], b[half:]]
            short -= 1
        if short:  # fewer pairs than ranks: repeat batches (counted)
            batches = batches + [batches[i % len(batches)] for i in range(short)]
            self.padded_batches = short
        return batches

    def __len__(self) -> int:
        return len(self.epoch_batches(self.epoch)) // self.num_replicas

    def __iter__(self) -> Iterator[list[int]]:
        mine = self.epoch_batches(self.epoch)[self.rank :: self.num_replicas]
        skip, self._skip = self._skip, 0
        self._yielded = skip
        for batch in mine[skip:]:
            self._yielded += 1
            yield batch.tolist()
        self.epoch, self._yielded = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches_yielded": self._yielded, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"resuming with seed {self.seed}, but the checkpoint's batches used seed {state['seed']}")
        self.epoch, self._skip = int(state["epoch"]), int(state["batches_yielded"])


def pad_pairs(src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray], index,
              multiple: int = 1) -> dict:
    """Pad a batch: source ids + eos; bos + target ids + eos; right-padded with pad_id to a width that is a
    multiple of ``multiple`` (8 under torch.compile: fewer distinct shapes, tensor-core-friendly sizes).

    ``src`` and ``tgt`` are ragged batches as Arrow stores them: (values, offsets), row i being
    ``values[offsets[i]:offsets[i+1]]`` with offsets[0] == 0. Returns LongTensors
    {"src": (B, S), "tgt": (B, T), "index": (B,)}.
    """
    out = {}
    for name, (values, offsets), before in (("src", src, 0), ("tgt", tgt, 1)):
        lengths = np.diff(offsets)  # (B,)
        batch, width = len(lengths), int(lengths.max(initial=0)) + before + 1
        width = -(-width // multiple) * multiple
        padded = np.full((batch, width), PAD_ID, dtype=np.int64)  # (B, S) or (B, T)
        rows = np.repeat(np.arange(batch), lengths)  # (n_tokens,) row of each token
        cols = np.arange(len(values)) - np.repeat(offsets[:-1], lengths) + before  # (n_tokens,) column
        padded[rows, cols] = values
        if before:
            padded[:, 0] = BOS_ID
        padded[np.arange(batch), lengths + before] = EOS_ID
        out[name] = torch.from_numpy(padded)
    out["index"] = torch.as_tensor(np.asarray(index), dtype=torch.long)  # (B,)
    return out
