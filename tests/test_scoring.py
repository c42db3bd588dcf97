"""score_reference: each reference's log-probability equals an independent teacher-forced forward pass, a beam
hypothesis scores its own log_prob, an ensemble scores the mean of its models, whatever the batching."""

import pytest
import torch
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.inference.ensemble import load_ensemble
from transformer_nmt.inference.scoring import ids_log_probs, token_log_probs
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.inference.translate import translate_hypotheses


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    root = tmp_path_factory.mktemp("scoring")
    paths = [root / "a.ckpt", root / "b.ckpt"]
    for seed, path in enumerate(paths):
        write_checkpoint(path, tokenizer, seed=seed, max_positions=128)
    return paths, multi30k_lines("val", "en", 10), multi30k_lines("val", "de", 10)


@torch.no_grad()
def forward_log_prob(model, tokenizer, source, reference):
    """One pair, one full forward pass: the sum of log p(token) over the reference's tokens and the eos."""
    src = torch.tensor([tokenizer.encode(source) + [tokenizer.eos_id]])
    tgt = [tokenizer.bos_id] + tokenizer.encode(reference) + [tokenizer.eos_id]
    logits = model(src, torch.tensor([tgt[:-1]]))[0]  # (T, V)
    logits[:, [0, tokenizer.bos_id]] = float("-inf")
    log_probs = torch.log_softmax(logits, -1)
    return sum(float(log_probs[t, token]) for t, token in enumerate(tgt[1:])), len(tgt) - 1


def test_scores_equal_a_teacher_forced_forward_pass_whatever_the_batch(setup):
    paths, sources, references = setup
    model, tokenizer, _ = load_checkpoint(paths[0])
    batched = token_log_probs(model, tokenizer, sources, references, max_tokens=4096)
    alone = token_log_probs(model, tokenizer, sources, references, max_tokens=1)  # one pair a batch
    for got, one, source, reference in zip(batched, alone, sources, references):
        expected, n = forward_log_prob(model, tokenizer, source, reference)
        assert len(got) == n and sum(got) == pytest.approx(expected, abs=1e-4)
        assert one == pytest.approx(got, abs=1e-5)


def test_a_beam_hypothesis_scores_its_own_log_prob_and_an_ensemble_the_mean(setup):
    paths, sources, _ = setup
    model, tokenizer, _ = load_checkpoint(paths[0])
    src_ids, results = translate_hypotheses(model, tokenizer, sources, beam=3, max_len_offset=4)
    hyps = [h for hyps in results for h in hyps]
    scored = ids_log_probs(model, tokenizer, src_ids, [h.tokens + [tokenizer.eos_id] for h in hyps], 4096)
    # An output stopped at its length limit (source + 4) has no eos: its log_prob leaves the eos term out.
    ended = [len(h.tokens) < len(s) + 4 for h, s in zip(hyps, src_ids)]
    assert [sum(s) if e else sum(s[:-1]) for s, e in zip(scored, ended)] == \
           pytest.approx([h.log_prob for h in hyps], abs=1e-3)
    ensemble, _, _ = load_ensemble([str(p) for p in paths])
    other, _, _ = load_checkpoint(paths[1])
    refs = multi30k_lines("val", "de", 4)
    mean = token_log_probs(ensemble, tokenizer, sources[:4], refs, 4096)
    each = [token_log_probs(m, tokenizer, sources[:4], refs, 4096) for m in (model, other)]
    for got, a, b in zip(mean, *each):
        assert got == pytest.approx([(x + y) / 2 for x, y in zip(a, b)], abs=1e-5)


def test_score_reference_writes_sum_per_token_and_count_per_line(tmp_path, setup):
    paths, sources, references = setup
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sources[:3]), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in references[:3]), encoding="utf-8")
    translate_main([f"ckpt={paths[0]}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}",
                    f"score_reference={tmp_path / 'ref.txt'}"])
    rows = [line.split("\t") for line in (tmp_path / "out.txt").read_text().splitlines()]
    model, tokenizer, _ = load_checkpoint(paths[0])
    assert len(rows) == 3
    for (total, per_token, count), source, reference in zip(rows, sources, references):
        expected, n = forward_log_prob(model, tokenizer, source, reference)
        assert float(total) == pytest.approx(expected, abs=1e-3) and int(count) == n
        assert float(per_token) == pytest.approx(expected / n, abs=1e-3)
    (tmp_path / "short.txt").write_text("Ein Hund.\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=f"score_reference={tmp_path / 'short.txt'}: 3 input lines but 1 reference"):
        translate_main([f"ckpt={paths[0]}", f"input={tmp_path / 'in.txt'}",
                        f"score_reference={tmp_path / 'short.txt'}"])
