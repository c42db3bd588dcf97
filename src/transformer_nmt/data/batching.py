"""Batching by tokens (paper section 5.1: "each training batch contained a set of sentence pairs
containing approximately 25000 source tokens and 25000 target tokens").

``TokenBucketBatchSampler`` groups pairs of similar length so that each batch, once padded, holds at
most ``max_tokens`` source tokens and at most ``max_tokens`` target tokens (fairseq's ``--max-tokens``):
with n pairs, source width S (tokens + eos) and target width T (bos + tokens + eos), n*S <= max_tokens
and n*T <= max_tokens. ``pad_pairs`` turns a batch of token ids into the padded tensors the model eats.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def pair_widths(src_lens: np.ndarray, tgt_lens: np.ndarray) -> np.ndarray:
    """Padded width each pair needs: max(source + eos, bos + target + eos)."""
    return np.maximum(np.asarray(src_lens, dtype=np.int32) + 1, np.asarray(tgt_lens, dtype=np.int32) + 2)


def pack_sorted(widths: np.ndarray, max_tokens: int) -> np.ndarray:
    """Greedily cut positions 0..n-1 of ascending ``widths`` into runs with count * last width <= max_tokens,
    each as long as it can be; returns the end (exclusive) of every run.

    Widths ascend, so a run's padded width is its last width. Pairs of one width w fill runs of
    max_tokens // w exactly, all at once; only the run that crosses into wider pairs is extended group by
    group. The loop runs about once per distinct width: O(n) after the sort, whatever the number of runs.
    """
    n = len(widths)
    group_end = np.append(np.flatnonzero(np.diff(widths)) + 1, n).tolist()  # end of each run of equal widths
    ends, start, g = [], 0, 0
    while start < n:
        while group_end[g] <= start:
            g += 1
        capacity = max(1, max_tokens // int(widths[start]))
        full = (group_end[g] - start) // capacity  # runs that pairs of this width fill alone
        ends.append(start + capacity * np.arange(1, full + 1))
        start += capacity * full
        if start == group_end[g]:
            continue
        end = group_end[g]  # the rest of this width, then as many wider pairs as fit
        for h in range(g + 1, len(group_end)):
            reach = start + max_tokens // int(widths[group_end[h] - 1])  # longest run ending at width h
            if reach <= group_end[h - 1]:
                break
            end = min(reach, group_end[h])
            if end < group_end[h]:
                break
        ends.append(np.array([end]))
        start = end
    return np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)


def equalize(batches: list[np.ndarray], replicas: int) -> tuple[list[np.ndarray], int]:
    """Make the number of batches a multiple of ``replicas``, splitting the largest in two before repeating.

    Returns the batches and how many were repeated (only when there are fewer pairs than ranks).
    """
    short = -len(batches) % replicas
    while short and any(len(b) > 1 for b in batches):
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        b = batches.pop(largest)
        half = len(b) // 2
        batches[largest:largest] = [b[:half], b[half:]]
        short -= 1
    if short:  # fewer pairs than ranks: repeat batches (counted)
        batches = batches + [batches[i % len(batches)] for i in range(short)]
    return batches, short


def _sort_keys(widths: np.ndarray) -> np.ndarray:
    """Widths as uint16 when they fit: numpy's stable sort is then a radix sort, O(n)."""
    return widths.astype(np.uint16) if widths.max(initial=0) < 2**16 else widths


def plan_epoch(widths: np.ndarray, max_tokens: int, seed: int, epoch: int, replicas: int,
               shuffle: bool = True) -> tuple[list[np.ndarray], int]:
    """All batches of an epoch over ``replicas`` ranks, in deal order, and how many are repeats (see
    ``equalize``). Sorted by width with ties in random order, packed, equalized, then shuffled."""
    rng = np.random.default_rng([seed, epoch])
    if shuffle:
        order = rng.permutation(len(widths))
        order = order[np.argsort(_sort_keys(widths[order]), kind="stable")]  # by width, ties in random order
    else:
        order = np.argsort(_sort_keys(widths), kind="stable")
    batches = np.split(order, pack_sorted(widths[order], max_tokens)[:-1]) if len(order) else []
    batches, repeated = equalize(batches, replicas)
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches, repeated


class TokenBucketBatchSampler:
    """Length-bucketed batches of pair indices, bounded by ``max_tokens`` padded tokens per side.

    - ``widths``: each pair's padded width (``pair_widths``); a memory-mapped array serves.
    - Shuffled per epoch from ``seed + epoch`` (ties in length broken at random, then batch order
      shuffled); without ``shuffle``, batches are in length order. Same seed and epoch, same batches.
    - DDP: rank r of R takes batches r, r+R, r+2R, ... of the epoch's list (``plan_epoch``), made a
      multiple of R by ``equalize``; ``padded_batches`` counts repeats. A rank keeps only its own batches.
    - ``set_epoch(e)`` selects the epoch; after a complete pass the epoch advances by itself.
    - Resume: ``state_dict()`` holds the epoch, the batches each rank has taken and the number of ranks.
      Resumed with as many ranks, each skips what it consumed. With another number, the batches that no
      rank had reached are dealt anew among the new ranks (made a multiple of their number by
      ``equalize``), so every pair of the epoch is still seen exactly once (``dealt_before`` records
      the earlier runs of the epoch: (ranks, batches per rank)).
    - When planning an epoch takes more than ``plan_ahead_seconds`` (about a second at 4.5M pairs), the
      next epoch is planned in a background thread while this one is consumed.
    """

    plan_ahead_seconds = 1.0

    def __init__(self, widths, max_tokens: int, shuffle: bool = True, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0, pad_to_multiple: int = 1, epoch_widths=None, epoch_members=None):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.max_tokens, self.pad_to_multiple = max_tokens, pad_to_multiple
        self.widths = self._checked(widths)
        # epoch -> (n,) widths, where every epoch has its own (subword sampling: data/subword_sampling.py)
        self.epoch_widths = epoch_widths
        # epoch -> (m,) the indices an epoch holds, where it holds not each once (data.pairs' temperature sampling:
        # data/pair_sampling.py); the epoch is planned over their widths and deals them
        self.epoch_members = epoch_members
        self.shuffle, self.seed = shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self.dealt_before: list[tuple[int, int]] = []  # earlier runs of this epoch: (ranks, batches per rank)
        self.padded_batches = 0  # batches repeated in the last epoch dealt, so that all ranks have as many
        self.plan_seconds = 0.0  # time the last plan took
        self._yielded = 0
        self._mine: tuple[tuple, list[np.ndarray], int] | None = None  # (key, this rank's batches, repeats)
        self._ahead: tuple[tuple, Future] | None = None
        self._executor: ThreadPoolExecutor | None = None

    def _checked(self, widths) -> np.ndarray:
        widths = np.asarray(widths)
        if self.pad_to_multiple > 1:  # as pad_pairs pads: the plan bounds the widths the batches will have
            widths = -(-widths // self.pad_to_multiple) * self.pad_to_multiple
        if len(widths) and widths.max() > self.max_tokens:
            raise ValueError(
                f"data.max_tokens={self.max_tokens} is smaller than the longest pair ({widths.max()} padded tokens "
                f"with bos/eos): raise data.max_tokens or lower data.max_positions"
            )
        return widths

    def widths_of(self, epoch: int) -> np.ndarray:
        """The pairs' padded widths in ``epoch`` (the same every epoch unless ``epoch_widths`` was given)."""
        if self.epoch_widths is None:
            return self.widths
        widths = self._checked(self.epoch_widths(epoch))
        if len(widths) != len(self.widths):
            raise ValueError(f"epoch {epoch} has widths for {len(widths)} pairs, not {len(self.widths)}")
        return widths

    @property
    def sampler(self):
        """Lightning sets the epoch through ``dataloader.batch_sampler.sampler.set_epoch``."""
        return self

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.dealt_before = epoch, []

    def epoch_batches(self, epoch: int, dealt_before=()) -> list[np.ndarray]:
        """The batches of an epoch over all ranks, in deal order, leaving out those of ``dealt_before``."""
        return self._remaining(epoch, tuple(dealt_before))[0]

    def _remaining(self, epoch: int, dealt_before: tuple) -> tuple[list[np.ndarray], int]:
        ranks = [r for r, _ in dealt_before] + [self.num_replicas]
        widths = self.widths_of(epoch)
        members = None if self.epoch_members is None else np.asarray(self.epoch_members(epoch))  # (m,)
        batches, repeated = plan_epoch(widths if members is None else widths[members], self.max_tokens, self.seed,
                                       epoch, ranks[0], self.shuffle)
        for (replicas, taken), following in zip(dealt_before, ranks[1:]):
            batches, repeated = equalize(batches[replicas * taken:], following)
        if members is not None:  # positions among the epoch's members -> the indices they are
            batches = [members[b] for b in batches]
        return batches, repeated

    def _deal(self, key: tuple) -> tuple[list[np.ndarray], int]:
        start = time.perf_counter()
        batches, repeated = self._remaining(*key)
        mine = [b.astype(np.int32 if len(self.widths) < 2**31 else np.int64)
                for b in batches[self.rank :: self.num_replicas]]  # copies: the epoch's order is freed
        self.plan_seconds = time.perf_counter() - start
        return mine, repeated

    def _my_batches(self) -> list[np.ndarray]:
        key = (self.epoch, tuple(self.dealt_before))
        if self._mine is None or self._mine[0] != key:
            ahead, self._ahead = self._ahead, None
            self._mine = (key, *(ahead[1].result() if ahead and ahead[0] == key else self._deal(key)))
        self.padded_batches = self._mine[2]
        return self._mine[1]

    def _plan_ahead(self) -> None:
        key = (self.epoch + 1, ())
        if self.plan_seconds > self.plan_ahead_seconds and self._ahead is None:
            self._executor = self._executor or ThreadPoolExecutor(1, thread_name_prefix="plan-epoch")
            self._ahead = (key, self._executor.submit(self._deal, key))

    def __len__(self) -> int:
        return sum(taken for _, taken in self.dealt_before) + len(self._my_batches())

    def __iter__(self) -> Iterator[list[int]]:
        mine = self._my_batches()
        self._plan_ahead()
        self._yielded = 0
        for batch in mine:
            self._yielded += 1
            yield batch.tolist()
        self.epoch, self.dealt_before, self._yielded = self.epoch + 1, [], 0

    def position(self, epoch: int, dealt_before, taken: int) -> dict:
        """The resumable state after ``taken`` batches of this rank's deal of ``epoch`` (after ``dealt_before``)."""
        earlier = [list(d) for d in dealt_before]
        if earlier and earlier[-1][0] == self.num_replicas:  # same world size: one count
            taken += earlier.pop()[1]
        return {"epoch": epoch, "batches_yielded": taken, "num_replicas": self.num_replicas,
                "dealt_before": earlier, "seed": self.seed, "max_tokens": self.max_tokens,
                "pad_to_multiple": self.pad_to_multiple, "members_drawn": self.epoch_members is not None}

    def state_dict(self) -> dict:
        return self.position(self.epoch, self.dealt_before, self._yielded)

    def load_state_dict(self, state: dict) -> None:
        dealt = [(int(r), int(k)) for r, k in state.get("dealt_before", [])]
        if int(state["batches_yielded"]):  # checkpoints without num_replicas were written by as many ranks
            dealt.append((int(state.get("num_replicas", self.num_replicas)), int(state["batches_yielded"])))
        if dealt:
            self._check_same_plan(state, int(state["epoch"]), sum(k for _, k in dealt))
        self.epoch, self.dealt_before = int(state["epoch"]), dealt

    def _check_same_plan(self, state: dict, epoch: int, taken: int) -> None:
        """Mid-epoch, the batches not yet taken are those of the checkpoint's plan: planned from another shuffle
        seed, token budget or width multiple, the rest of the epoch would repeat some pairs and never show others."""
        # A checkpoint written before each epoch's members were drawn anew (data.pair_temperature over pairs of
        # unequal size) planned its epoch over one draw made at set-up: the rest of its epoch is not this plan's.
        drawn = self.epoch_members is not None
        if bool(state.get("members_drawn", False)) != drawn:
            raise ValueError(
                f"the checkpoint stopped in epoch {epoch} after {taken} batches of a plan "
                f"{'with' if state.get('members_drawn') else 'without'} members drawn each epoch "
                f"(data.pair_temperature over pairs of unequal size); this run plans {'with' if drawn else 'without'}"
                f": the rest of the epoch would show some pairs twice and others never. Resume from a checkpoint "
                f"written at the end of an epoch")
        keys = {"seed": "data.seed", "max_tokens": "data.max_tokens", "pad_to_multiple": "data.pad_to_multiple"}
        saved = {key: state.get(key, getattr(self, key)) for key in keys}
        if all(saved[key] == getattr(self, key) for key in keys):
            return
        then = " ".join(f"{name}={saved[key]}" for key, name in keys.items())
        now = " ".join(f"{name}={getattr(self, key)}" for key, name in keys.items())
        raise ValueError(
            f"the checkpoint stopped in epoch {epoch} after {taken} batches, planned with {then}; this run plans "
            f"with {now}: the rest of the epoch would show some pairs twice and others never. Resume with {then} "
            f"(train.compile=true pads to a multiple of 8), and change them at an epoch boundary (a checkpoint "
            f"written at the end of an epoch)")

    def __getstate__(self) -> dict:  # the background plan does not travel
        return {**self.__dict__, "_ahead": None, "_executor": None}


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
