"""The Multi30k literature's BLEU (inference/multi30k_bleu.py): lowercased, on Moses-normalized and -tokenized
text, against hand-tokenized references scored by sacreBLEU with no tokenizer of its own."""

import pytest
from sacrebleu.metrics import BLEU

from transformer_nmt.inference.evaluate import score
from transformer_nmt.inference.multi30k_bleu import MISSING, multi30k_bleu

pytest.importorskip("sacremoses")

HYPOTHESES = ["Ein Mann, der „läuft“ – schnell!", "Zwei Hunde spielen im Schnee."]
REFERENCES = ["Ein Mann, der \"rennt\" - schnell!", "Zwei Hunde spielen im tiefen Schnee."]
# by hand: Moses splits punctuation off words, normalizes „ “ to " and the en dash to -; then lowercased
HAND_HYPOTHESES = ['ein mann , der " läuft " - schnell !', "zwei hunde spielen im schnee ."]
HAND_REFERENCES = ['ein mann , der " rennt " - schnell !', "zwei hunde spielen im tiefen schnee ."]


def test_multi30k_bleu_equals_sacrebleu_on_hand_tokenized_lowercased_text():
    expected = BLEU(tokenize="none").corpus_score(HAND_HYPOTHESES, [HAND_REFERENCES]).score
    result = multi30k_bleu(HYPOTHESES, REFERENCES, "de")
    assert result["bleu_multi30k"] == pytest.approx(expected, abs=1e-4)
    assert "case:lc|eff:no|tok:none" in result["bleu_multi30k_signature"] and "moses:sacremoses" in \
        result["bleu_multi30k_signature"]
    # not sacreBLEU's 13a: "„läuft“" is one token there (13a does not split these quotes off), so the scores differ
    assert BLEU(lowercase=True).corpus_score(HYPOTHESES, [REFERENCES]).score != pytest.approx(expected, abs=0.5)


def test_score_reports_the_convention_beside_cased_and_lowercased_bleu(monkeypatch):
    metrics = score(HYPOTHESES, REFERENCES, "de")
    assert {"bleu", "bleu_lowercase", "bleu_multi30k", "chrf"} <= set(metrics)
    assert metrics["bleu_multi30k"] == multi30k_bleu(HYPOTHESES, REFERENCES, "de")["bleu_multi30k"]
    assert score(HYPOTHESES, REFERENCES)["bleu_multi30k"] is None  # no target language: not computed, and why
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert multi30k_bleu(HYPOTHESES, REFERENCES, "de") == {"bleu_multi30k": None, "bleu_multi30k_signature": MISSING}
