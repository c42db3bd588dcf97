"""Token-bucket batching: the max_tokens bound, one pass per epoch, determinism, DDP ranks, resume, and the
same batches as the original O(n x batches) planner (kept here as the reference)."""

import numpy as np
import pytest
import torch

from transformer_nmt.data.batching import TokenBucketBatchSampler as _Sampler
from transformer_nmt.data.batching import pad_pairs, pair_widths


def TokenBucketBatchSampler(src, tgt, *args, **kwargs):
    return _Sampler(pair_widths(src, tgt), *args, **kwargs)


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


@pytest.mark.parametrize("changed", [{"max_tokens": 1200}, {"pad_to_multiple": 8}, {"seed": 12}],
                         ids=["max_tokens", "pad", "seed"])
def test_resume_mid_epoch_with_another_token_budget_pad_multiple_or_seed_is_refused(changed):
    """The rest of the epoch is the checkpoint's plan: re-derived from other settings, the batches already taken
    no longer match it, and pairs would be seen twice or never, silently."""
    src, tgt = random_lengths()
    sampler = TokenBucketBatchSampler(src, tgt, 1500, seed=11)
    it = iter(sampler)
    taken = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    options = {"max_tokens": 1500, "seed": 11, **changed}
    resumed = TokenBucketBatchSampler(src, tgt, options.pop("max_tokens"), **options)
    with pytest.raises(ValueError, match=r"stopped in epoch 0 after 5 batches, planned with data.seed=11 "
                                         r"data.max_tokens=1500 data.pad_to_multiple=1; .* some pairs twice and "
                                         r"others never. Resume with data.seed=11 data.max_tokens=1500 "
                                         r"data.pad_to_multiple=1 "):
        resumed.load_state_dict(state)
    # what the silent re-derivation would have done: some pairs of the epoch twice, some never
    rest = TokenBucketBatchSampler(src, tgt, **{"max_tokens": 1500, "seed": 11, **changed}).epoch_batches(0, [(1, 5)])
    seen = np.concatenate([np.concatenate(taken), *rest])
    assert len(np.unique(seen)) != len(seen) or len(seen) != len(src)
    list(it)  # at the epoch boundary the settings may change
    TokenBucketBatchSampler(src, tgt, 1200, seed=12).load_state_dict(sampler.state_dict())


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


# ----------------------------------------------------------------------- the original planner, as the reference


def reference_pack_sorted(widths, max_tokens):
    """The planner before it was made O(n): rescans every remaining pair for each batch."""
    n = len(widths)
    runs, start = [], 0
    while start < n:
        counts = np.arange(1, n - start + 1)
        fits = counts * widths[start:] <= max_tokens
        end = start + max(1, int(np.searchsorted(~fits, True)))
        runs.append(np.arange(start, end))
        start = end
    return runs


def reference_epoch_batches(widths, max_tokens, seed, epoch, replicas, shuffle=True):
    widths = np.asarray(widths, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    if shuffle:
        order = rng.permutation(len(widths))
        order = order[np.argsort(widths[order], kind="stable")]
    else:
        order = np.argsort(widths, kind="stable")
    batches = [order[run] for run in reference_pack_sorted(widths[order], max_tokens)]
    short = -len(batches) % replicas
    while short and any(len(b) > 1 for b in batches):
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        b = batches.pop(largest)
        half = len(b) // 2
        batches[largest:largest] = [b[:half], b[half:]]
        short -= 1
    if short:
        batches = batches + [batches[i % len(batches)] for i in range(short)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


@pytest.mark.parametrize("corpus_seed", [0, 1, 2])
def test_batches_identical_to_the_reference_planner(corpus_seed):
    rng = np.random.default_rng(corpus_seed)
    n = int(rng.integers(500, 4000))
    src = np.clip(rng.lognormal(2.8, 0.7, n).astype(int), 0, 250)  # long-tailed like WMT; a few empty sides
    tgt = np.clip((src * rng.normal(1.1, 0.3, n)).astype(int), 0, 250)
    widths = pair_widths(src, tgt)
    for max_tokens in (int(widths.max()), 300, 1000, 3125):
        for replicas in (1, 2, 3, 8):
            for shuffle in (True, False):
                reference = reference_epoch_batches(widths, max_tokens, 5, corpus_seed, replicas, shuffle)
                for r in range(replicas):
                    sampler = _Sampler(widths, max_tokens, shuffle=shuffle, seed=5, num_replicas=replicas, rank=r)
                    sampler.set_epoch(corpus_seed)
                    assert list(sampler) == [b.tolist() for b in reference[r::replicas]], (max_tokens, replicas, r)


def test_tiny_corpora_identical_to_the_reference_planner():
    for widths in ([5], [3, 3, 3], [2, 9], [4, 4, 4, 4, 4, 4, 4]):
        for replicas in (1, 2, 5):
            reference = reference_epoch_batches(widths, 9, 0, 0, replicas)
            ours = _Sampler(np.array(widths), 9, seed=0, num_replicas=replicas).epoch_batches(0)
            assert [b.tolist() for b in ours] == [b.tolist() for b in reference]


# ----------------------------------------------------------------------- resuming with another number of ranks


def consume(samplers, steps):
    """Each rank takes ``steps`` batches (in lockstep, as under DDP); returns them and rank 0's state."""
    iterators = [iter(s) for s in samplers]
    taken = [next(it) for _ in range(steps) for it in iterators]
    return taken, samplers[0].state_dict()


@pytest.mark.parametrize("before, after", [(3, 2), (2, 5), (4, 1), (1, 3)])
def test_resuming_with_another_world_size_deals_the_rest_of_the_epoch(before, after):
    src, tgt = random_lengths(n=2500, seed=4)
    widths = pair_widths(src, tgt)
    old = [_Sampler(widths, 1500, seed=9, num_replicas=before, rank=r) for r in range(before)]
    for s in old:
        s.set_epoch(1)
    first, state = consume(old, 4)
    assert (state["num_replicas"], state["batches_yielded"], state["epoch"]) == (before, 4, 1)
    new = [_Sampler(widths, 1500, seed=9, num_replicas=after, rank=r) for r in range(after)]
    for s in new:
        s.load_state_dict(state)
        s.set_epoch(1)  # Lightning sets the epoch again on restart
    rest = [list(s) for s in new]
    assert len({len(r) for r in rest}) == 1  # every new rank has as many batches
    seen = [i for b in first for i in b] + [i for r in rest for b in r for i in b]
    assert sorted(seen) == list(range(len(src)))  # every pair of the epoch exactly once
    remaining = {tuple(b.tolist()) for b in old[0].epoch_batches(1)[4 * before:]}
    whole = sum(tuple(b) in remaining for r in rest for b in r)
    assert whole >= len(remaining) - after  # the old plan's batches, at most after - 1 split in two
    for batch in (b for r in rest for b in r):
        assert len(batch) * widths[batch].max() <= 1500
    assert all(s.epoch == 2 and s.dealt_before == [] for s in new)  # the next epoch is whole again
    assert sorted(i for s in new for b in s for i in b) == list(range(len(src)))


def test_world_size_changes_twice_in_one_epoch_and_the_state_round_trips():
    src, tgt = random_lengths(n=3000, seed=6)
    widths = pair_widths(src, tgt)
    first, state = consume([_Sampler(widths, 1200, seed=2, num_replicas=4, rank=r) for r in range(4)], 3)
    middle_samplers = [_Sampler(widths, 1200, seed=2, num_replicas=2, rank=r) for r in range(2)]
    for s in middle_samplers:
        s.load_state_dict(state)
    middle, state = consume(middle_samplers, 5)
    assert state["dealt_before"] == [[4, 3]] and (state["num_replicas"], state["batches_yielded"]) == (2, 5)
    last_samplers = [_Sampler(widths, 1200, seed=2, num_replicas=3, rank=r) for r in range(3)]
    for s in last_samplers:
        s.load_state_dict(state)
    assert last_samplers[0].state_dict() == {**state, "num_replicas": 3, "batches_yielded": 0,
                                             "dealt_before": [[4, 3], [2, 5]]}
    last = [b for s in last_samplers for b in s]
    assert sorted(i for b in first + middle + last for i in b) == list(range(len(src)))


def test_same_world_size_resume_keeps_one_count():
    src, tgt = random_lengths()
    samplers = [_Sampler(pair_widths(src, tgt), 1500, seed=1, num_replicas=2, rank=r) for r in range(2)]
    _, state = consume(samplers, 3)
    resumed = _Sampler(pair_widths(src, tgt), 1500, seed=1, num_replicas=2, rank=0)
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert resumed.state_dict() == {"epoch": 0, "batches_yielded": 4, "num_replicas": 2, "dealt_before": [],
                                    "seed": 1, "max_tokens": 1500, "pad_to_multiple": 1, "members_drawn": False}
    assert len(resumed) == len(samplers[0])  # the epoch's length as Lightning counts it, resumed or not


def test_next_epoch_planned_in_the_background_gives_the_same_batches(monkeypatch):
    src, tgt = random_lengths()
    plain = TokenBucketBatchSampler(src, tgt, 1500, seed=3)
    expected = [list(plain), list(plain)]
    monkeypatch.setattr(_Sampler, "plan_ahead_seconds", -1.0)  # always plan ahead
    ahead = TokenBucketBatchSampler(src, tgt, 1500, seed=3)
    first = list(ahead)
    assert ahead._ahead is not None and ahead._ahead[0] == (1, ())  # epoch 1 was planned while 0 ran
    assert [first, list(ahead)] == expected


def test_resume_mid_epoch_across_drawing_members_each_epoch_or_not_is_refused():
    """A checkpoint whose plan drew its members once (written before each epoch's members were drawn anew, or a run
    without data.pair_temperature's draw) is not the plan of a run that draws them each epoch, nor the reverse:
    mid-epoch it is refused; at an epoch boundary it resumes."""
    src, tgt = random_lengths()
    members = lambda epoch: np.random.default_rng(epoch).choice(len(src), len(src) // 2, replace=False)  # noqa: E731
    once = TokenBucketBatchSampler(src, tgt, 1500, seed=11)
    it = iter(once)
    [next(it) for _ in range(3)]
    old = {k: v for k, v in once.state_dict().items() if k != "members_drawn"}  # as such a checkpoint holds it
    with pytest.raises(ValueError, match=r"stopped in epoch 0 after 3 batches of a plan without members drawn each "
                                         r"epoch .* this run plans with: .* end of an epoch"):
        TokenBucketBatchSampler(src, tgt, 1500, seed=11, epoch_members=members).load_state_dict(old)
    drawn = TokenBucketBatchSampler(src, tgt, 1500, seed=11, epoch_members=members)
    it = iter(drawn)
    [next(it) for _ in range(2)]
    with pytest.raises(ValueError, match="a plan with members drawn each epoch"):
        TokenBucketBatchSampler(src, tgt, 1500, seed=11).load_state_dict(drawn.state_dict())
    resumed = TokenBucketBatchSampler(src, tgt, 1500, seed=11, epoch_members=members)
    resumed.load_state_dict(drawn.state_dict())  # the same plan resumes
    assert resumed.epoch == 0
    list(it)  # at the epoch boundary either way resumes
    TokenBucketBatchSampler(src, tgt, 1500, seed=11).load_state_dict(drawn.state_dict())
