"""Lexically constrained decoding (generation/constrained.py, ``translate constraints=FILE``): every phrase is in
every output (one- and multi-token phrases, two phrases, a phrase the model produces anyway), eos waits until
they are, sentences without constraints decode exactly as the plain beam decodes them in the same batch, the
allocation follows Post & Vilar, bad constraint files are refused naming file and line, and engines that cannot
honour constraints (greedy, sampling, CTranslate2) refuse them naming the option."""

import pytest
import torch
from reference_decoding import IDS, MarkovTable, random_model, random_sources
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.generation import strategies
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.constrained import Progress, allocate, dba_search
from transformer_nmt.generation.search import beam_search
from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
from transformer_nmt.inference.translate import main as translate_main


def contains(tokens, phrase) -> bool:
    return any(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def batch_of(src, constraints):
    return strategies.SearchBatch(src, IDS["bos_id"], IDS["eos_id"], list(range(len(src))), None, constraints)


CONSTRAINTS = [
    [[7]],  # one token
    [],  # none: decoded by the plain beam
    [[9, 5, 11]],  # a multi-token phrase
    [[6, 6], [13]],  # two phrases, one repeating a token
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 4])
def test_every_phrase_is_in_every_output_and_unconstrained_rows_are_the_plain_beam(seed, k):
    model, src = random_model(seed, vocab=16), random_sources(seed, vocab=16)
    decode = DecodeConfig(strategy="beam", beam=k, max_len_offset=8, n_best=1)
    got = strategies.generate(model, batch_of(src, CONSTRAINTS), decode)
    plain = beam_search(model, src, beam_size=k, alpha=0.6, max_len_offset=8, **IDS)
    for i, phrases in enumerate(CONSTRAINTS):
        assert got[i], i
        for phrase in phrases:
            assert contains(got[i][0].tokens, phrase), (i, phrase, got[i][0].tokens)
        if not phrases:  # tokens exactly; scores within float32 noise (a smaller batch pads differently)
            assert [h.tokens for h in got[i]] == [h.tokens for h in plain[i]]
            assert [h.score for h in got[i]] == pytest.approx([h.score for h in plain[i]], abs=1e-5)


def test_a_phrase_the_model_produces_anyway_is_met_without_change():
    """Constraints taken from the unconstrained output itself: met, and the best output is that output (the
    search finds it in the bank of all constraints met, where it is the best)."""
    model, src = random_model(2, vocab=16), random_sources(2, vocab=16)
    plain = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=8, **IDS)
    constraints = [[h[0].tokens[:2]] if len(h[0].tokens) >= 2 else [] for h in plain]
    assert sum(map(bool, constraints)) >= 2
    got = dba_search(model, src[[i for i, c in enumerate(constraints) if c]], [c for c in constraints if c],
                     beam_size=4, alpha=0.6, max_len_offset=8, **IDS)
    have = [i for i, c in enumerate(constraints) if c]
    for hyps, i in zip(got, have):
        assert contains(hyps[0].tokens, constraints[i][0])
        assert hyps[0].score >= plain[i][0].score - 1e-5 or hyps[0].tokens == plain[i][0].tokens


def eos_loving_table():
    """bos -> eos .9 | a .1; a -> eos .9 | c .1; c -> eos .9 | a .1; b (never likely) -> eos. A plain search
    says the empty output; a constraint "c a" needs five tokens of low probability before eos."""
    a, b, c, V = 4, 5, 6, 8
    probs = [[0.0] * V for _ in range(V)]
    probs[2][3], probs[2][a] = 0.9, 0.1
    probs[a][3], probs[a][c] = 0.9, 0.1
    probs[c][3], probs[c][a] = 0.9, 0.1
    probs[b][3] = 1.0
    return MarkovTable(probs)


def test_eos_waits_until_every_constraint_is_met():
    model = eos_loving_table()
    src = torch.tensor([[4, 4, 4, 3]])
    assert beam_search(model, src, beam_size=3, alpha=0.6, max_len_offset=8, **IDS)[0][0].tokens == []
    (hyps,) = dba_search(model, src, [[[6, 4], [4]]], beam_size=3, alpha=0.6, max_len_offset=8, n_best=3, **IDS)
    assert hyps and all(contains(h.tokens, [6, 4]) and contains(h.tokens, [4]) for h in hyps)
    assert hyps[0].tokens == [4, 6, 4]  # the most likely output that holds "c a" (and "a")


def test_progress_tracks_phrases_and_unwinds_a_broken_one():
    p = Progress.start([[5, 6, 7], [9]])
    assert p.wanted() == [5, 9] and p.produced == 0
    p = p.advance(5).advance(6)
    assert p.wanted() == [7] and p.produced == 2 and not p.done
    p = p.advance(8)  # broken: unwound
    assert p.produced == 0 and p.wanted() == [5, 9]
    p = p.advance(9).advance(5).advance(6).advance(7)
    assert p.done and p.produced == 4 and p.wanted() == []


def test_allocation_shares_the_beam_by_progress():
    banks = {0: ["a0", "a1", "a2", "a3"], 1: ["b0"], 2: ["c0", "c1", "c2"]}
    # k 4 over 3 banks: 1 each, the remainder to the furthest (bank 2); bank 1 has one, so its slot is used
    assert allocate(banks, 4, 3) == ["c0", "c1", "b0", "a0"]
    # a bank short of candidates hands its slots on, furthest banks first
    assert allocate({0: ["a0", "a1", "a2"], 2: ["c0"]}, 6, 3) == ["c0", "a0", "a1", "a2"]
    assert allocate({0: ["a0", "a1", "a2"], 1: ["b0", "b1", "b2"]}, 4, 4) == ["b0", "b1", "b2", "a0"]


def test_greedy_and_sampling_refuse_constraints():
    model, src = random_model(0, vocab=16), random_sources(0, vocab=16)
    for decode in (DecodeConfig(beam=1), DecodeConfig(strategy="sample")):
        with pytest.raises(ValueError, match="constraints need a beam"):
            strategies.generate(model, batch_of(src, CONSTRAINTS), decode)


def test_ctranslate2_refuses_constraints_and_processors_naming_the_option():
    check = CTranslate2Model.check_request  # reads only its arguments: no export needed
    with pytest.raises(ValueError, match="constraints= needs engine=native"):
        check(None, DecodeConfig(), has_constraints=True)
    with pytest.raises(ValueError, match="no_repeat_ngram=2 needs engine=native"):
        check(None, DecodeConfig(no_repeat_ngram=2))
    check(None, DecodeConfig())  # nothing to refuse


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("constrained") / "m.ckpt"
    write_checkpoint(path, tiny_tokenizer())
    return path


def run_translate(checkpoint, tmp_path, lines, constraint_lines, *extra):
    src, cons, out = tmp_path / "in.txt", tmp_path / "cons.tsv", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    cons.write_text("".join(line + "\n" for line in constraint_lines), encoding="utf-8")
    translate_main([f"ckpt={checkpoint}", f"input={src}", f"output={out}", f"constraints={cons}",
                    "max_len_offset=12", *extra])
    return out.read_text(encoding="utf-8").splitlines(), cons


def test_translate_meets_the_constraints_of_a_file(checkpoint, tmp_path):
    """The command line: phrases are text, tokenized with the model's SentencePiece; a blank constraint line
    leaves its input unconstrained and translated as without the option."""
    lines = ["a man rides a bike", "two dogs play", "a woman sings"]
    out, _ = run_translate(checkpoint, tmp_path, lines, ["Hund", "", "Frau\tsingt laut"])
    assert len(out) == 3
    assert "Hund" in out[0] and "Frau" in out[2] and "singt laut" in out[2]
    plain = tmp_path / "plain.txt"
    (tmp_path / "in2.txt").write_text("two dogs play\n", encoding="utf-8")
    translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'in2.txt'}", f"output={plain}", "max_len_offset=12"])
    assert out[1] == plain.read_text(encoding="utf-8").splitlines()[0]


@pytest.mark.parametrize("constraint_lines, message", [
    (["Hund", ""], r"cons.tsv has 2 lines but the input 3"),
    (["Hund", "", "Frau\t\tsingt"], r"cons.tsv:3: phrase 2 is empty"),
    (["Hund\t", "", ""], r"cons.tsv:1: phrase 2 is empty"),
    (["", "  \tHund", ""], r"cons.tsv:2: phrase 1 is empty"),
    (["", "", " ".join(["Hund"] * 200)], r"cons.tsv:3: the phrases take \d+ tokens, more than the \d+ the output"),
])
def test_bad_constraint_files_are_refused_naming_file_and_line(checkpoint, tmp_path, constraint_lines, message):
    with pytest.raises(SystemExit, match=message):
        run_translate(checkpoint, tmp_path, ["a man", "a dog", "a cat"], constraint_lines)
    assert not (tmp_path / "out.txt").exists()  # nothing written: the refusal comes before any output


def test_translate_refuses_constraints_with_greedy_naming_the_option(checkpoint, tmp_path):
    with pytest.raises(SystemExit, match="constraints need a beam"):
        run_translate(checkpoint, tmp_path, ["a man"], ["Hund"], "beam=1")


def test_the_study_draws_missing_reference_words_longest_first():
    """studies/constrained_terminology.py's rule: reference words of >= min_chars characters, punctuation
    stripped, that the output lacks (case-sensitive), longest first, ties in reference order, at most ``words``."""
    from study_scripts import load_study

    study = load_study("constrained_terminology")
    assert study.words_of("„Ein Mann“, der (lacht).") == ["Ein", "Mann", "der", "lacht"]
    reference = "Ein Mann mit Hut fährt Fahrrad, und eine Frau lacht."
    assert study.terminology(reference, "Ein Mann fährt Rad.", 2, 4) == ["Fahrrad", "lacht"]
    assert study.terminology(reference, "Ein Mann fährt Fahrrad.", 3, 4) == ["lacht", "eine", "Frau"]
    assert study.terminology(reference, reference, 2, 4) == []
    assert study.terminology("Der Hund", "der hund", 1, 3) == ["Hund"]


def test_a_phrase_ends_where_a_word_ends():
    """Token 6 continues a word (``word_continuations``) and is what the model says after 7; the phrase [7] must
    not be followed by it, though the search without the mask says "7 6"."""
    V = 8
    probs = [[0.0] * V for _ in range(V)]
    probs[2][7], probs[2][3] = 0.6, 0.4  # bos -> 7 | eos
    probs[7][6], probs[7][3], probs[7][4] = 0.8, 0.15, 0.05  # 7 -> 6 (continues the word) | eos | 4
    probs[6][3], probs[4][3] = 1.0, 1.0
    model, src = MarkovTable(probs), torch.tensor([[4, 4, 3]])
    continuations = torch.zeros(V, dtype=torch.bool)
    continuations[6] = True
    assert dba_search(model, src, [[[7]]], beam_size=3, alpha=0.6, max_len_offset=5, **IDS)[0][0].tokens == [7, 6]
    (hyps,) = dba_search(model, src, [[[7]]], beam_size=3, alpha=0.6, max_len_offset=5,
                         word_continuations=continuations, **IDS)
    assert hyps[0].tokens == [7]


def test_word_continuations_are_pieces_without_a_boundary_that_start_a_letter_digit_or_hyphen():
    class Pieces:
        pieces = ["<pad>", "\u2581Hund", "es", "-", ".", "\u2581ein", "9", "\u2010", ",", "\u2581"]
        vocab_size = len(pieces)

        def id_to_piece(self, i):
            return self.pieces[i]

    from transformer_nmt.generation.constrained import word_continuations

    assert word_continuations(Pieces()).tolist() == [False, False, True, True, False, False, True, True, False, False]
