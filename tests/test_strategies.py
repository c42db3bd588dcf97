"""The search-strategy seam: translate decodes every batch through generation.strategies, so a new mode is a
function registered there; the settings pick greedy, sampling or beam search as before."""

import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.generation import strategies
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.search import Hypothesis, beam_search, greedy_search
from transformer_nmt.inference.translate import translate_hypotheses

LINES = ["A man rides a bike.", "", "Two dogs play in the snow."]


def test_the_settings_name_the_strategy():
    assert strategies.strategy_name(DecodeConfig()) == "beam"
    assert strategies.strategy_name(DecodeConfig(beam=1)) == "greedy"
    assert strategies.strategy_name(DecodeConfig(beam=1, sampling=True)) == "sample"
    assert strategies.strategy_name(DecodeConfig(beam=4, sampling=True)) == "sample"


def test_translate_decodes_through_the_registered_strategy(tmp_path, monkeypatch):
    """A strategy swapped into the registry is what translate runs, with the batch's sources, special ids and line
    numbers; the registered beam strategy gives beam_search's own hypotheses."""
    tokenizer = tiny_tokenizer()
    write_checkpoint(tmp_path / "m.ckpt", tokenizer)
    model, tokenizer, _ = load_checkpoint(tmp_path / "m.ckpt")
    seen = []

    def constant(model, batch, decode):
        seen.append((batch.bos_id, batch.eos_id, batch.line_ids, tuple(batch.src.shape)))
        return [[Hypothesis([7, 8], -1.5)] for _ in batch.line_ids]

    monkeypatch.setitem(strategies.STRATEGIES, "beam", constant)
    _, results = translate_hypotheses(model, tokenizer, LINES, first_line=10)
    assert [[h.tokens for h in hyps] for i, hyps in enumerate(results) if LINES[i]] == [[[7, 8]], [[7, 8]]]
    # rows in the batch's order (by length), each with its line in the whole input
    ids = (tokenizer.bos_id, tokenizer.eos_id)
    assert [(bos, eos, sorted(lines)) for bos, eos, lines, _ in seen] == [(*ids, [10, 12])]
    monkeypatch.undo()

    sources, results = translate_hypotheses(model, tokenizer, LINES[:1], beam=3, n_best=2, max_len_offset=5)
    src = torch.tensor([sources[0]])
    expected = beam_search(model, src, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, beam_size=3, alpha=0.6,
                           max_len_offset=5, n_best=2)
    assert [(h.tokens, h.score) for h in results[0]] == [(h.tokens, h.score) for h in expected[0]]
    _, results = translate_hypotheses(model, tokenizer, LINES[:1], beam=1, max_len_offset=5)
    greedy = greedy_search(model, src, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, max_len_offset=5)
    assert results[0][0].tokens == greedy[0].tokens
