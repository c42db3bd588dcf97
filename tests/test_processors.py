"""The per-step hook of every search (generation/processors.py) and its first processor, n-gram blocking
(``no_repeat_ngram``): with no processor the searches give what they gave before the hook (outputs recorded from
main at bea1912, tests/decoding_golden.json); with blocking no output repeats an n-gram, greedy is unchanged where
its output had no repeat, and greedy and beam equal brute-force references that block by listing n-grams; the
strategy is the ``strategy`` field, the older flags its aliases, contradictions refused."""

import json
from dataclasses import fields, make_dataclass
from pathlib import Path

import pytest
import torch
from reference_decoding import BOS, IDS, model_log_probs, random_model, random_sources, reference_beam, reference_greedy

from transformer_nmt.generation import strategies
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.ngram_blocking import NoRepeatNGram
from transformer_nmt.generation.processors import active_options, active_processors, processor_option
from transformer_nmt.generation.sampling import Sampler
from transformer_nmt.generation.search import beam_search, greedy_search, max_output_lengths

GOLDEN = json.loads((Path(__file__).parent / "decoding_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"seed{c['seed']}")
def test_without_processors_the_searches_give_what_main_gave(case):
    """Tokens exactly, scores within 1e-5 (float32 sums; the same on one machine, a guard against reordered
    arithmetic elsewhere); the same inputs as the recording (random_model(seed, 16), random_sources(seed + 100))."""
    seed = case["seed"]
    model, src = random_model(seed, vocab=16), random_sources(seed + 100, vocab=16, B=5, S=7)
    decode = DecodeConfig()
    assert active_processors(decode) == []
    greedy = greedy_search(model, src, max_len_offset=6, processors=active_processors(decode), **IDS)
    assert [[h.tokens, pytest.approx(h.log_prob, abs=1e-5)] for h in greedy] == case["greedy"]
    sample = greedy_search(model, src, max_len_offset=6, choose=Sampler(list(range(5)), seed=seed), **IDS)
    assert [[h.tokens, pytest.approx(h.log_prob, abs=1e-5)] for h in sample] == case["sample"]
    for key, expected in case["beam"].items():
        k, penalty = key.split("_")
        got = beam_search(model, src, beam_size=int(k), alpha=0.6, max_len_offset=6, n_best=int(k), penalty=penalty,
                          **IDS)
        assert [[[h.tokens, pytest.approx(h.score, abs=1e-5), pytest.approx(h.log_prob, abs=1e-5)] for h in hyps]
                for hyps in got] == expected, key


def ngrams(tokens, n):
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def repeats(tokens, n) -> bool:
    grams = ngrams(tokens, n)
    return len(grams) != len(set(grams))


def blocking_log_probs(model, n):
    """The model's next-token log-probabilities with every token that would repeat an n-gram at -inf, found by
    listing the n-grams of the tokens so far: the brute-force reference of NoRepeatNGram."""
    plain = model_log_probs(model)

    def next_log_probs(src, tokens):
        log_probs = plain(src, tokens).clone()
        generated = tokens[1:] if tokens and tokens[0] == BOS else tokens
        for w in range(log_probs.numel()):
            if repeats(generated + [w], n):
                log_probs[w] = float("-inf")
        return log_probs
    return next_log_probs


def repetitive_model(seed):
    """A random model over 8 tokens whose outputs often repeat (few tokens, long outputs)."""
    return random_model(seed, vocab=8)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_greedy_with_blocking_repeats_no_ngram_and_equals_the_brute_force_reference(n):
    blocked_somewhere = 0
    for seed in range(4):
        model, src = repetitive_model(seed), random_sources(seed, vocab=8)
        limits = max_output_lengths(model, src, 8).tolist()
        plain = greedy_search(model, src, max_len_offset=8, **IDS)
        got = greedy_search(model, src, max_len_offset=8, processors=[NoRepeatNGram(n)], **IDS)
        for i, h in enumerate(got):
            assert not repeats(h.tokens, n)
            assert h.tokens == reference_greedy(model, src[i], limits[i], blocking_log_probs(model, n))
            if not repeats(plain[i].tokens, n):  # nothing was blocked on greedy's own path
                assert h.tokens == plain[i].tokens
                assert h.log_prob == pytest.approx(plain[i].log_prob, abs=1e-5)
            blocked_somewhere += repeats(plain[i].tokens, n)
    assert blocked_somewhere  # the unblocked outputs do repeat: the test exercised the blocking


@pytest.mark.parametrize("n", [2, 3])
def test_beam_with_blocking_repeats_no_ngram_and_equals_the_brute_force_reference(n):
    blocked_somewhere = 0
    for seed in range(3):
        model, src = repetitive_model(seed), random_sources(seed, vocab=8)
        limits = max_output_lengths(model, src, 8).tolist()
        got = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=8, n_best=3,
                          processors=[NoRepeatNGram(n)], **IDS)
        plain = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=8, n_best=3, **IDS)
        for i, hyps in enumerate(got):
            assert hyps and not any(repeats(h.tokens, n) for h in hyps)
            expected = reference_beam(model, src[i], 3, 0.6, limits[i], n_best=3,
                                      next_log_probs=blocking_log_probs(model, n))
            assert [h.tokens for h in hyps] == [tokens for tokens, _ in expected]
            assert [h.score for h in hyps] == pytest.approx([score for _, score in expected], abs=1e-4)
            blocked_somewhere += any(repeats(h.tokens, n) for h in plain[i])
    assert blocked_somewhere


def test_blocking_longer_than_any_output_changes_nothing():
    """No n-gram longer than the outputs can repeat: every search is then exactly the unblocked one."""
    model, src = repetitive_model(1), random_sources(1, vocab=8)
    longest = int(max_output_lengths(model, src, 8).max())
    block = [NoRepeatNGram(longest + 1)]
    for k in (2, 4):
        plain = beam_search(model, src, beam_size=k, alpha=0.6, max_len_offset=8, n_best=k, **IDS)
        got = beam_search(model, src, beam_size=k, alpha=0.6, max_len_offset=8, n_best=k, processors=block, **IDS)
        assert [[(h.tokens, h.score) for h in hyps] for hyps in got] == [[(h.tokens, h.score) for h in hyps]
                                                                         for hyps in plain]


def test_the_option_field_registers_the_processor_and_bad_values_name_it():
    processor_fields = [f.name for f in fields(DecodeConfig) if "processor" in f.metadata]
    assert processor_fields == ["no_repeat_ngram"]
    assert active_processors(DecodeConfig()) == [] and active_options(DecodeConfig()) == []
    (block,) = active_processors(DecodeConfig(no_repeat_ngram=3))
    assert isinstance(block, NoRepeatNGram) and block.n == 3
    assert active_options(DecodeConfig(no_repeat_ngram=3)) == ["no_repeat_ngram=3"]
    with pytest.raises(ValueError, match="no_repeat_ngram=-2"):
        active_processors(DecodeConfig(no_repeat_ngram=-2))


def test_a_processor_is_registered_by_its_field_alone_with_a_dotted_path():
    """The field names the class by its path: no import line beside it; a path that leads nowhere is an error naming
    the option, raised when the option is switched on."""
    spec = make_dataclass("WithOwn", [
        ("own", int, processor_option("transformer_nmt.generation.ngram_blocking.NoRepeatNGram", 0, "own")),
        ("lost", int, processor_option("transformer_nmt.generation.nowhere.Gone", 0, "lost"))], bases=(DecodeConfig,))
    (block,) = active_processors(spec(own=2))
    assert isinstance(block, NoRepeatNGram) and block.n == 2
    assert active_options(spec(lost=1)) == ["lost=1"] and active_processors(spec()) == []
    with pytest.raises(ImportError, match=r"decode.lost: its processor 'transformer_nmt.generation.nowhere.Gone'"):
        active_processors(spec(lost=1))


def test_every_strategy_passes_the_processors():
    """greedy, sample and beam through strategies.generate, no_repeat_ngram=1: no token twice in any output."""
    model, src = repetitive_model(2), random_sources(2, vocab=8)
    batch = strategies.SearchBatch(src, IDS["bos_id"], IDS["eos_id"], list(range(len(src))))
    for name in ("greedy", "sample", "beam"):
        out = strategies.generate(model, batch, DecodeConfig(strategy=name, no_repeat_ngram=1, max_len_offset=8))
        assert all(not repeats(h.tokens, 1) for hyps in out for h in hyps), name
        plain = strategies.generate(model, batch, DecodeConfig(strategy=name, max_len_offset=8))
        assert any(repeats(h.tokens, 1) for hyps in plain for h in hyps), name


def test_the_strategy_is_a_field_and_the_older_flags_are_aliases():
    name = strategies.strategy_name
    assert [name(DecodeConfig(strategy=s)) for s in ("greedy", "beam", "sample")] == ["greedy", "beam", "sample"]
    assert name(DecodeConfig(strategy="beam", beam=1)) == "beam"  # a beam of one, named: not greedy
    assert name(DecodeConfig(beam=1)) == "greedy" and name(DecodeConfig(sampling=True)) == "sample"
    assert name(DecodeConfig()) == "beam"
    with pytest.raises(ValueError, match="strategy='diverse': use one of greedy, sample, beam"):
        name(DecodeConfig(strategy="diverse"))
    with pytest.raises(ValueError, match="sampling=true asks for strategy=sample, not strategy=beam"):
        name(DecodeConfig(strategy="beam", sampling=True))
    with pytest.raises(ValueError, match="strategy=greedy keeps one hypothesis: drop beam=8"):
        name(DecodeConfig(strategy="greedy", beam=8))


def test_strategy_greedy_at_the_default_beam_is_greedy_search():
    model, src = random_model(5), random_sources(5)
    batch = strategies.SearchBatch(src, IDS["bos_id"], IDS["eos_id"], list(range(len(src))))
    got = strategies.generate(model, batch, DecodeConfig(strategy="greedy"))
    assert [hyps[0].tokens for hyps in got] == [h.tokens for h in greedy_search(model, src, max_len_offset=50, **IDS)]


def test_validation_decodes_through_the_strategies():
    """Validation BLEU's greedy search is generation/'s: the module's settings name it, and no search of its own."""
    from transformer_nmt.training import module

    assert strategies.strategy_name(module.VALIDATION_DECODE) == "greedy"
    source = Path(module.__file__).read_text()
    assert "generate(self.model" in source and "greedy_decode" not in source


@torch.no_grad()
def test_blocking_skips_rows_too_short_to_repeat():
    block = NoRepeatNGram(2)
    log_probs = torch.zeros(2, 6)
    from transformer_nmt.generation.processors import Step

    tokens = torch.tensor([[4, 5, 4], [4, 4, 4]])  # row 0: "4 5" seen, last 4 -> 5 blocked; row 1: "4 4" -> 4
    out = block(log_probs, Step(tokens, torch.arange(2), 3))
    assert torch.isinf(out).nonzero().tolist() == [[0, 5], [1, 4]]
    assert torch.equal(block(log_probs, Step(tokens[:, :1], torch.arange(2), 1)), log_probs)
