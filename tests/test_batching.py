"""Token-bucket batching: the max_tokens bound, one pass per epoch, determinism, DDP ranks, resume."""

import numpy as np
import pytest
import torch

from transformer_nmt.batching import TokenBucketBatchSampler, pad_pairs, pair_widths


def random_lengths(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 120, n)
    tgt = np.clip(src + rng.integers(-10, 30, n), 1, 150)
    return src, tgt


def test_no_batch_exceeds_max_tokens_on_either_side():
    src, tgt = random_lengths()
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=1000, seed=1)
    for batch in sampler:
        n = len(batch)
        assert n * (src[batch].max() + 1) <= 1000  # padded source incl. eos
        assert n * (tgt[batch].max() + 2) <= 1000  # padded target incl. bos, eos


def test_batches_are_length_bucketed():
    src, tgt = random_lengths()
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=2000, shuffle=False)
    widths = pair_widths(src, tgt)
    padded = sum(len(b) * widths[b].max() for b in sampler)
    assert widths.sum() / padded > 0.95  # little padding when lengths are sorted into buckets


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_pair_appears_exactly_once_per_epoch(shuffle):
    src, tgt = random_lengths()
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=1500, shuffle=shuffle, seed=3)
    for epoch in range(2):
        seen = np.concatenate([np.asarray(b) for b in sampler])
        assert sorted(seen.tolist()) == list(range(len(src))), epoch


def test_same_seed_same_order_and_each_epoch_reshuffles():
    src, tgt = random_lengths()
    a = TokenBucketBatchSampler(src, tgt, max_tokens=1500, seed=7)
    b = TokenBucketBatchSampler(src, tgt, max_tokens=1500, seed=7)
    epoch0 = list(a)
    assert epoch0 == list(b)
    epoch1 = list(a)  # a full pass advances the epoch
    assert epoch1 != epoch0
    c = TokenBucketBatchSampler(src, tgt, max_tokens=1500, seed=7)
    c.set_epoch(1)
    assert list(c) == epoch1
    assert list(TokenBucketBatchSampler(src, tgt, max_tokens=1500, seed=8)) != epoch0


@pytest.mark.parametrize("replicas", [2, 3])
def test_ranks_get_disjoint_batches_covering_the_epoch_in_equal_numbers(replicas):
    src, tgt = random_lengths(n=2001)
    samplers = [TokenBucketBatchSampler(src, tgt, 1500, seed=5, num_replicas=replicas, rank=r) for r in range(replicas)]
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1
    assert all(len(s) == len(per_rank[0]) for s in samplers)
    indices = [i for batches in per_rank for batch in batches for i in batch]
    assert sorted(indices) == list(range(len(src)))  # disjoint and covering
    assert samplers[0].padded_batches == 0


def test_fewer_pairs_than_ranks_repeats_batches_and_counts_them():
    samplers = [TokenBucketBatchSampler([3, 4], [3, 4], 100, num_replicas=3, rank=r) for r in range(3)]
    per_rank = [list(s) for s in samplers]
    assert all(len(b) == 1 for b in per_rank)
    assert samplers[0].padded_batches == 1


def test_resume_mid_epoch_skips_consumed_batches():
    src, tgt = random_lengths()
    sampler = TokenBucketBatchSampler(src, tgt, 1500, seed=11)
    sampler.set_epoch(2)
    full = sampler.epoch_batches(2)
    it = iter(sampler)
    consumed = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    assert state["epoch"] == 2 and state["batches_yielded"] == 5
    resumed = TokenBucketBatchSampler(src, tgt, 1500, seed=11)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # Lightning sets the epoch again on restart: must keep the skip
    rest = list(resumed)
    assert consumed + rest == [b.tolist() for b in full]
    assert len(list(resumed)) == len(full)  # the next epoch is whole again


def test_pair_longer_than_max_tokens_is_an_error():
    with pytest.raises(ValueError, match="data.max_tokens=50 is smaller than the longest pair"):
        TokenBucketBatchSampler([10, 60], [10, 10], max_tokens=50)


def test_pad_pairs_adds_bos_eos_and_padding():
    src = (np.array([5, 6, 7, 8]), np.array([0, 3, 4]))  # rows [5, 6, 7], [8]
    tgt = (np.array([9, 10]), np.array([0, 1, 2]))  # rows [9], [10]
    batch = pad_pairs(src, tgt, [4, 2])
    assert batch["src"].tolist() == [[5, 6, 7, 3], [8, 3, 0, 0]]
    assert batch["tgt"].tolist() == [[2, 9, 3], [2, 10, 3]]
    assert batch["index"].tolist() == [4, 2]
    assert batch["src"].dtype == torch.long
