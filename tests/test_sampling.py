"""Sampling: top_k=1 is greedy; a seed gives the same samples twice and whatever the batching; tokens outside
the nucleus (top_p) or the top k never appear, on distributions known in advance."""

from collections import Counter

import pytest
import torch
from reference_decoding import early_eos_table
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID
from transformer_nmt.generation.sampling import Sampler, filter_log_probs
from transformer_nmt.generation.search import greedy_search
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.inference.translate import translate_hypotheses

IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID}  # the tokenizer's special ids, which the searches take

KNOWN = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()  # (1, 4)


def draws(log_probs, n, **options):
    """Token counts of n draws, each from its own sentence's generator (sentence ids 0..n-1)."""
    sampler = Sampler(list(range(n)), seed=7, **options)
    return Counter(sampler(log_probs.expand(n, -1), torch.arange(n), 0).tolist())


def test_top_p_keeps_the_shortest_run_that_reaches_p():
    assert set(draws(KNOWN, 2000, top_p=0.8)) == {0, 1}  # 0.5 + 0.3 reaches 0.8: tokens 2 and 3 never
    assert set(draws(KNOWN, 2000, top_p=0.81)) == {0, 1, 2}
    assert set(draws(KNOWN, 2000, top_p=0.4)) == {0}
    counts = draws(KNOWN, 4000)
    assert set(counts) == {0, 1, 2, 3}
    assert counts[0] / 4000 == pytest.approx(0.5, abs=0.03) and counts[3] / 4000 == pytest.approx(0.05, abs=0.015)
    nucleus = draws(KNOWN, 4000, top_p=0.8)
    assert nucleus[0] / 4000 == pytest.approx(0.5 / 0.8, abs=0.03)  # renormalised over the nucleus


def test_top_k_and_temperature():
    assert set(draws(KNOWN, 2000, top_k=2)) == {0, 1}
    logits = filter_log_probs(KNOWN, temperature=0.5, top_k=0, top_p=1.0)
    expected = KNOWN.exp() ** 2 / (KNOWN.exp() ** 2).sum()  # p ** (1 / T), renormalised
    assert torch.softmax(logits, -1) == pytest.approx(expected, abs=1e-6)


def test_top_p_excluded_continuations_never_appear_in_decoded_outputs():
    """bos -> a .6 | eos .4; a -> c .7 | eos .3; c -> d .99 | eos .01; d -> eos .99 | a .01. With top_p 0.75 the
    .01 continuations are outside every nucleus: "a c" (eos after c) and "a c d a" never appear."""
    model, acd = early_eos_table()
    n = 3000
    src = torch.tensor([[4, 5, 3]]).expand(n, -1)
    a, c = acd[0], acd[1]

    def outputs(**options):
        sampler = Sampler(list(range(n)), seed=1, **options)
        return Counter(tuple(h.tokens) for h in greedy_search(model, src, max_len_offset=5, choose=sampler, **IDS))

    free = outputs()
    assert free[(a, c)] > 0 and free[()] > 0  # without top_p the .01 branch shows up
    nucleus = outputs(top_p=0.75)
    assert set(nucleus) == {(), (a,), tuple(acd)}
    assert nucleus[()] / n == pytest.approx(0.4, abs=0.03)


# --- through translate ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("sampling") / "model.ckpt"
    write_checkpoint(path, tiny_tokenizer())
    return path


@pytest.fixture(scope="module")
def loaded(checkpoint):
    model, tokenizer, _ = load_checkpoint(checkpoint)
    return model, tokenizer, multi30k_lines("val", "en", 12)


def test_top_k_1_equals_greedy(loaded):
    model, tokenizer, lines = loaded
    greedy = translate_hypotheses(model, tokenizer, lines, beam=1)[1]
    sampled = translate_hypotheses(model, tokenizer, lines, sampling=True, top_k=1, seed=3)[1]
    assert [h[0].tokens for h in sampled] == [h[0].tokens for h in greedy]
    assert [h[0].log_prob for h in sampled] == pytest.approx([h[0].log_prob for h in greedy], abs=1e-5)


def test_a_seed_gives_the_same_samples_twice_and_whatever_the_batch(loaded):
    model, tokenizer, lines = loaded

    def sample(batch_lines, **options):
        return [h[0].tokens for h in translate_hypotheses(model, tokenizer, batch_lines, sampling=True,
                                                           **options)[1]]

    first, again = sample(lines, seed=5), sample(lines, seed=5)
    assert first == again
    assert first != sample(lines, seed=6)
    assert first != [h[0].tokens for h in translate_hypotheses(model, tokenizer, lines, beam=1)[1]]
    # Batches of one: each line keeps its generator (seeded from its line number), so its sample.
    assert sample(lines, seed=5, max_tokens=1) == first


def test_sampling_options_without_sampling_or_with_a_beam_are_errors(checkpoint):
    with pytest.raises(SystemExit, match="temperature=0.5 top_k=3 set.* add sampling=true"):
        translate_main([f"ckpt={checkpoint}", "temperature=0.5", "top_k=3", "input=/dev/null"])
    with pytest.raises(SystemExit, match="sampling=true draws one output per line: drop beam=3"):
        translate_main([f"ckpt={checkpoint}", "sampling=true", "beam=3", "input=/dev/null"])
    with pytest.raises(SystemExit, match="top_p=1.5: must be in"):
        translate_main([f"ckpt={checkpoint}", "sampling=true", "top_p=1.5", "input=/dev/null"])
