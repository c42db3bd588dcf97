"""Ensembles: one model's ensemble is that model; two models' equals a slow step-by-step reference that averages
their log-softmax over full forward passes; ckpt=[A,B] through translate and evaluate; another tokenizer refused."""

import json

import pytest
import torch
from reference_decoding import model_log_probs, random_model, random_sources, reference_beam, reference_greedy
from tiny_checkpoint import multi30k_lines, reordered_pieces, tiny_tokenizer, write_checkpoint

from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID
from transformer_nmt.generation.ensemble import Ensemble
from transformer_nmt.generation.search import beam_search, greedy_search
from transformer_nmt.inference.ensemble import load_ensemble
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.inference.translate import translate_hypotheses

IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID}  # the tokenizer's special ids, which the searches take


def mean_log_probs(models):
    """The reference: each model's log-softmax from a full forward pass over the whole prefix, averaged."""
    singles = [model_log_probs(m) for m in models]

    @torch.no_grad()
    def next_log_probs(src, tokens):
        return torch.stack([f(src, tokens) for f in singles]).mean(0)
    return next_log_probs


def two_models():
    # Different architectures: the ensemble needs a shared vocabulary only.
    return [random_model(0), random_model(1, d_model=24, n_heads=3, n_decoder_layers=1)]


def test_ensemble_of_one_equals_the_model():
    model, src = random_model(0), random_sources(0)
    alone = Ensemble([model])
    assert [h.tokens for h in greedy_search(alone, src, max_len_offset=5, **IDS)] == \
           [h.tokens for h in greedy_search(model, src, max_len_offset=5, **IDS)]
    ours = beam_search(alone, src, beam_size=3, alpha=0.6, max_len_offset=5, n_best=3, **IDS)
    theirs = beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=5, n_best=3, **IDS)
    assert [[h.tokens for h in hyps] for hyps in ours] == [[h.tokens for h in hyps] for hyps in theirs]
    assert all(a.score == b.score and a.log_prob == b.log_prob for x, y in zip(ours, theirs) for a, b in zip(x, y))


def test_greedy_ensemble_of_two_equals_the_step_by_step_mean():
    models, src = two_models(), random_sources(1)
    lengths = (src != 0).sum(1)
    got = greedy_search(Ensemble(models), src, max_len_offset=5, **IDS)
    reference = mean_log_probs(models)
    expected = [reference_greedy(None, src[i], int(lengths[i]) + 5, reference) for i in range(len(src))]
    assert [h.tokens for h in got] == expected
    assert [h.tokens for h in got] != [h.tokens for h in greedy_search(models[0], src, max_len_offset=5, **IDS)]
    for i, h in enumerate(got):  # log_prob: the reference's mean log-probabilities of the tokens and the eos
        row = src[i][src[i] != 0].unsqueeze(0)
        prefix, total = [2], 0.0
        for token in h.tokens + ([3] if len(h.tokens) < int(lengths[i]) + 5 else []):
            total += float(reference(row, prefix)[token])
            prefix.append(token)
        assert h.log_prob == pytest.approx(total, abs=1e-4)


@pytest.mark.parametrize("k,alpha", [(2, 0.6), (4, 1.0)])
def test_beam_ensemble_of_two_equals_the_step_by_step_mean(k, alpha):
    models, src = two_models(), random_sources(2)
    lengths = (src != 0).sum(1)
    got = beam_search(Ensemble(models), src, beam_size=k, alpha=alpha, max_len_offset=4, n_best=2, **IDS)
    for i, hyps in enumerate(got):
        expected = reference_beam(None, src[i], k, alpha, int(lengths[i]) + 4, n_best=2,
                                  next_log_probs=mean_log_probs(models))
        assert [h.tokens for h in hyps] == [tokens for tokens, _ in expected]
        assert [h.score for h in hyps] == pytest.approx([score for _, score in expected], abs=1e-4)


# --- through the commands ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    root = tmp_path_factory.mktemp("ensemble")
    paths = [root / "a.ckpt", root / "b.ckpt"]
    for seed, path in enumerate(paths):
        write_checkpoint(path, tokenizer, seed=seed)
    return paths


def test_ensemble_translation_does_not_depend_on_the_batch(checkpoints):
    model, tokenizer, _ = load_ensemble([str(p) for p in checkpoints])
    assert isinstance(model, Ensemble)
    lines = multi30k_lines("val", "en", 6)
    for beam in (1, 3):  # random models never stop: outputs of source length + 8 (not 50), padded in the batch
        search = {"beam": beam, "max_len_offset": 8}
        one_by_one = [translate_hypotheses(model, tokenizer, [line], **search)[1][0][0].tokens for line in lines]
        batched = [hyps[0].tokens for hyps in translate_hypotheses(model, tokenizer, lines, **search)[1]]
        assert batched == one_by_one and len({len(tokens) for tokens in batched}) > 1


def test_translate_and_evaluate_take_a_list_of_checkpoints(tmp_path, checkpoints):
    a, b = (str(p) for p in checkpoints)
    (tmp_path / "in.txt").write_text("A dog runs.\n\nTwo men talk.\n", encoding="utf-8")
    outputs = {}
    for name, ckpt in (("single", a), ("listed", f"[{a}]"), ("ensemble", f"[{a},{b}]")):
        translate_main([f"ckpt={ckpt}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / name}", "beam=2"])
        outputs[name] = (tmp_path / name).read_text(encoding="utf-8")
    assert outputs["single"] == outputs["listed"]  # ckpt=A and ckpt=[A]: the same model
    assert len(outputs["ensemble"].split("\n")) == 4 and outputs["ensemble"] != outputs["single"]
    model, tokenizer, _ = load_ensemble([a, b])
    expected = [tokenizer.decode(h[0].tokens) for h in translate_hypotheses(
        model, tokenizer, ["A dog runs.", "", "Two men talk."], beam=2)[1]]
    assert outputs["ensemble"].split("\n")[:3] == expected
    (tmp_path / "ref.txt").write_text("Ein Hund rennt.\n\nZwei Männer reden.\n", encoding="utf-8")
    result = evaluate_main([f"ckpt=[{a},{b}]", f"src={tmp_path / 'in.txt'}", f"ref={tmp_path / 'ref.txt'}",
                            f"out={tmp_path / 'eval'}", "beam=2"])
    assert result["checkpoint"] == [a, b]
    assert (tmp_path / "eval" / "in.txt.hyp").read_text(encoding="utf-8").split("\n")[:3] == expected
    assert json.loads((tmp_path / "eval" / "in.txt.json").read_text())["sentences"] == 3


def test_another_tokenizer_is_refused_naming_both_files(tmp_path, checkpoints):
    other = tmp_path / "other.ckpt"
    write_checkpoint(other, tiny_tokenizer(vocab_size=180))
    with pytest.raises(SystemExit, match=f"checkpoint {other} has another tokenizer than {checkpoints[0]}"):
        translate_main([f"ckpt=[{checkpoints[0]},{other}]", "input=/dev/null"])
    pieces, swapped = tmp_path / "pieces.ckpt", tmp_path / "swapped.ckpt"  # one source model, ids that differ
    tokenizer = tiny_tokenizer()
    write_checkpoint(pieces, reordered_pieces(reordered_pieces(tokenizer)))  # swapped twice: the model's own order
    write_checkpoint(swapped, reordered_pieces(tokenizer))
    with pytest.raises(SystemExit, match=r"has another tokenizer than .*pieces.ckpt \(their joint vocabularies "
                                         r"\(pieces\) differ\)"):
        translate_main([f"ckpt=[{pieces},{swapped}]", "input=/dev/null"])
    with pytest.raises(SystemExit, match="engine=ctranslate2 decodes one model"):
        translate_main([f"ckpt=[{checkpoints[0]},{checkpoints[1]}]", "engine=ctranslate2", "input=/dev/null"])
