"""Forced prefixes: every output starts with its prefix, then continues as decoding from bos + prefix does; an
empty prefix is plain decoding; the outputs do not depend on the batch."""

import pytest
import torch
from reference_decoding import BOS, EOS, PAD, random_model, random_sources
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID
from transformer_nmt.generation.search import beam_search, greedy_search
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.inference.translate import translate_hypotheses

IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID}  # the tokenizer's special ids, which the searches take


def prefixes_of(rows, width):
    """(B, width) forced tokens, -1 past each row's own prefix."""
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


FORCED = [[5, 6, 7], [], [9], [4, 4]]


@torch.no_grad()
def test_greedy_continues_from_the_prefix_as_teacher_forcing_does():
    model, src = random_model(3), random_sources(3)
    lengths = (src != PAD).sum(1)
    got = greedy_search(model, src, max_len_offset=5, prefix=prefixes_of(FORCED, 3), **IDS)
    for i, h in enumerate(got):
        assert h.tokens[: len(FORCED[i])] == FORCED[i]
        row, tokens, total = src[i][src[i] != PAD].unsqueeze(0), [BOS], 0.0  # the reference: one forward per step
        for step in range(int(lengths[i]) + 5):
            logits = model(row, torch.tensor([tokens]))[0, -1]
            logits[[PAD, BOS]] = float("-inf")
            log_probs = torch.log_softmax(logits, -1)
            token = FORCED[i][step] if step < len(FORCED[i]) else int(log_probs.argmax())
            total += float(log_probs[token])
            if token == EOS:
                break
            tokens.append(token)
        assert h.tokens == tokens[1:] and h.log_prob == pytest.approx(total, abs=1e-4)


def test_beam_outputs_start_with_the_prefix_and_an_empty_prefix_is_plain_decoding():
    model, src = random_model(4), random_sources(4)
    got = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=5, n_best=3, prefix=prefixes_of(FORCED, 3),
                      **IDS)
    for i, hyps in enumerate(got):
        assert hyps and all(h.tokens[: len(FORCED[i])] == FORCED[i] for h in hyps)
    plain = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=5, n_best=3, **IDS)
    empty = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=5, n_best=3,
                        prefix=prefixes_of([[]] * 4, 1), **IDS)
    assert [[(h.tokens, h.score) for h in x] for x in empty] == [[(h.tokens, h.score) for h in x] for x in plain]
    assert [[h.tokens for h in x] for x in got][1] == [h.tokens for h in plain[1]]  # row 1 has no prefix


# --- through translate ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix") / "model.ckpt"
    write_checkpoint(path, tiny_tokenizer())
    return path


@pytest.mark.parametrize("mode", [{"beam": 1}, {"beam": 3}, {"sampling": True, "seed": 2}])
def test_translate_forces_each_line_s_prefix_whatever_the_batch(checkpoint, mode):
    model, tokenizer, _ = load_checkpoint(checkpoint)
    lines = multi30k_lines("val", "en", 8)
    prefixes = ["Ein Mann", "", "Zwei", "Eine Frau mit", "", "Ein", "Kinder", "Der Hund"]
    _, batched = translate_hypotheses(model, tokenizer, lines, prefixes=prefixes, **mode)
    for prefix, hyps in zip(prefixes, batched):
        assert hyps[0].tokens[: len(tokenizer.encode(prefix))] == (tokenizer.encode(prefix) if prefix else [])
    alone = translate_hypotheses(model, tokenizer, lines, prefixes=prefixes, max_tokens=1, **mode)[1]  # 1 a batch
    assert [h[0].tokens for h in alone] == [h[0].tokens for h in batched]
    plain = translate_hypotheses(model, tokenizer, lines, **mode)[1]
    empty = translate_hypotheses(model, tokenizer, lines, prefixes=[""] * len(lines), **mode)[1]
    assert [h[0].tokens for h in empty] == [h[0].tokens for h in plain]


def test_prefix_file_through_the_command(tmp_path, checkpoint):
    (tmp_path / "in.txt").write_text("A dog runs.\nTwo men talk.\n", encoding="utf-8")
    (tmp_path / "prefix.txt").write_text("Ein Hund\n\n", encoding="utf-8")
    translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}",
                    f"prefix={tmp_path / 'prefix.txt'}"])
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert len(out) == 3 and out[0].startswith("Ein Hund")
    (tmp_path / "short.txt").write_text("Ein Hund\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=f"prefix={tmp_path / 'short.txt'}: prefix file has 1 lines but the input 2"):
        translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'in.txt'}", f"prefix={tmp_path / 'short.txt'}"])
