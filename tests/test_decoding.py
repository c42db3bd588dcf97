"""Greedy and beam search: beam 1 is greedy; the cached batched search equals a slow reference."""

import math

import pytest
import torch
from reference_decoding import (
    BOS,
    EOS,
    IDS,
    PAD,
    early_eos_table,
    random_model,
    random_sources,
    reference_beam,
    reference_greedy,
)

from transformer_nmt.data.tokenizer import BOS_ID
from transformer_nmt.generation.search import beam_search, greedy_decode, length_penalty


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equals_uncached_reference(seed):
    model, src = random_model(seed), random_sources(seed)
    lengths = (src != PAD).sum(1)
    hyps = greedy_decode(model, src, max_len_offset=5, **IDS)
    assert hyps == [reference_greedy(model, src[i], int(lengths[i]) + 5) for i in range(len(src))]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_size_one_equals_greedy(seed):
    model, src = random_model(seed), random_sources(seed)
    greedy = greedy_decode(model, src, max_len_offset=5, **IDS)
    beam = beam_search(model, src, beam_size=1, alpha=0.6, max_len_offset=5, **IDS)
    assert [hyps[0].tokens for hyps in beam] == greedy


@pytest.mark.parametrize("stop", ["bound", "k_finished"])
@pytest.mark.parametrize("seed, k, alpha", [(0, 4, 0.6), (1, 3, 1.0), (2, 4, 0.0), (3, 2, 0.6)])
def test_cached_batched_beam_search_equals_slow_reference(seed, k, alpha, stop):
    model, src = random_model(seed), random_sources(seed)
    lengths = (src != PAD).sum(1)
    results = beam_search(model, src, beam_size=k, alpha=alpha, max_len_offset=4, stop=stop, **IDS)
    for i, hyps in enumerate(results):
        [(tokens, score)] = reference_beam(model, src[i], k, alpha, int(lengths[i]) + 4, stop)
        assert hyps[0].tokens == tokens
        assert hyps[0].score == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize("seed, k, alpha", [(0, 4, 1.0), (1, 3, 0.8), (4, 5, 1.0)])
def test_power_length_penalty_search_equals_slow_reference(seed, k, alpha):
    """decode.length_penalty=power (fairseq's --lenpen, CTranslate2's length_penalty): scores / |Y| ** alpha."""
    model, src = random_model(seed), random_sources(seed)
    lengths = (src != PAD).sum(1)
    results = beam_search(model, src, beam_size=k, alpha=alpha, max_len_offset=4, n_best=2, penalty="power", **IDS)
    for i, hyps in enumerate(results):
        reference = reference_beam(model, src[i], k, alpha, int(lengths[i]) + 4, n_best=2,
                                   lp=lambda n, a: float(n) ** a)
        assert [h.tokens for h in hyps] == [tokens for tokens, _ in reference]
        assert [h.score for h in hyps] == pytest.approx([score for _, score in reference], abs=1e-4)
        for h in hyps:  # log_prob: the score times the penalty of the length (eos counted, none at the limit)
            length = len(h.tokens) + (len(h.tokens) < int(lengths[i]) + 4)
            assert h.log_prob == pytest.approx(h.score * length ** alpha, abs=1e-4)


def test_an_unknown_length_penalty_is_refused_naming_the_choices():
    model, src = random_model(0), random_sources(0)
    with pytest.raises(ValueError, match=r"length_penalty='fairseq'.*\('gnmt', 'power'\)"):
        beam_search(model, src, beam_size=2, alpha=1.0, max_len_offset=2, penalty="fairseq", **IDS)


def test_n_best_equal_slow_reference():
    model, src = random_model(5), random_sources(5)
    lengths = (src != PAD).sum(1)
    results = beam_search(model, src, beam_size=4, alpha=0.6, n_best=3, max_len_offset=4, **IDS)
    for i, hyps in enumerate(results):
        reference = reference_beam(model, src[i], 4, 0.6, int(lengths[i]) + 4, n_best=3)
        assert [h.tokens for h in hyps] == [tokens for tokens, _ in reference]
        assert [h.score for h in hyps] == pytest.approx([score for _, score in reference], abs=1e-4)


def test_n_best_are_sorted_and_distinct():
    model, src = random_model(7), random_sources(7)
    results = beam_search(model, src, beam_size=4, alpha=0.6, n_best=3, max_len_offset=5, **IDS)
    for hyps in results:
        assert len(hyps) == 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 3
        assert all(EOS not in h.tokens and BOS not in h.tokens for h in hyps)


def test_output_length_is_bounded_by_source_length_plus_offset():
    model = random_model(0)
    src = random_sources(0)
    unreachable_eos = model.config.vocab_size  # no token id can equal it: every sentence runs to its limit
    lengths = (src != PAD).sum(1).tolist()
    greedy = greedy_decode(model, src, eos_id=unreachable_eos, max_len_offset=3, bos_id=BOS_ID)
    beam = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=3, eos_id=unreachable_eos, bos_id=BOS_ID)
    assert [len(h) for h in greedy] == [n + 3 for n in lengths]
    assert [len(h[0].tokens) for h in beam] == [n + 3 for n in lengths]


def test_length_penalty_formula():
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(10, 0.0) == 1.0
    assert length_penalty(7, 0.6, "power") == pytest.approx(7 ** 0.6)
    assert length_penalty(torch.tensor([4.0, 9.0]), 0.5, "power").tolist() == pytest.approx([2.0, 3.0])
    assert length_penalty(10, 0.0, "power") == 1.0


def test_old_rule_stops_at_two_short_hypotheses_bound_finds_the_better_long_one():
    model, acd = early_eos_table()
    src = torch.tensor([[4, 5, EOS]])
    # k = 2: the empty output (eos at step 1) and "a" (eos at step 2) are the two first to finish.
    [[old]] = beam_search(model, src, beam_size=2, alpha=0.6, max_len_offset=5, stop="k_finished", **IDS)
    [[new]] = beam_search(model, src, beam_size=2, alpha=0.6, max_len_offset=5, stop="bound", **IDS)
    assert old.tokens == [] and old.score == pytest.approx(math.log(0.4))
    # "a c d eos": 4 tokens, eos counted in |Y|.
    expected = math.log(0.6 * 0.7 * 0.99 * 0.99) / length_penalty(4, 0.6)
    assert new.tokens == acd and new.score == pytest.approx(expected, abs=1e-5)
    assert new.score > old.score
    assert greedy_decode(model, src, max_len_offset=5, **IDS) == [acd]
    [(tokens, score)] = reference_beam(model, src[0], 2, 0.6, 3 + 5)
    assert (tokens, score) == (acd, pytest.approx(expected, abs=1e-5))


@pytest.mark.parametrize("seed", [0, 1])
def test_bound_rule_never_scores_below_k_finished_rule(seed):
    """The bound rule stops only when no live beam can beat its best, and keeps the k best finished:
    its best hypothesis scores at least as well as that of the k-finished rule, for every sentence."""
    model, src = random_model(seed, vocab=16), random_sources(seed, vocab=16, B=8)
    old = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=6, stop="k_finished", **IDS)
    new = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=6, stop="bound", **IDS)
    for o, n in zip(old, new):
        assert n[0].score >= o[0].score - 1e-6
