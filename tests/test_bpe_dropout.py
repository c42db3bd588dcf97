"""BPE-dropout (data/bpe_dropout.py) against SentencePiece itself: at alpha 0 it is SentencePiece's segmentation,
sentence by sentence; at 0.1 it lengthens the text as much as SentencePiece's own sampler does (the same
algorithm, other draws); at 1 no merge is left; and a sample is the same in another process, which SentencePiece's
sampler is not (the reason the module exists)."""

import io
import json
import random
import subprocess
import sys

import pytest
import sentencepiece as spm
from tiny_corpus import multi30k_lines

from transformer_nmt.data.bpe_dropout import BpeDropout
from transformer_nmt.data.tokenizer import Tokenizer


def lines(lang: str, n: int) -> list[str]:
    return [line.rstrip("\n") for line in multi30k_lines(lang, n)]


def trained(model_type: str, **options) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines("en", 3000) + lines("de", 3000)), model_writer=model,
                                   vocab_size=1500, model_type=model_type, character_coverage=1.0, pad_id=0,
                                   unk_id=1, bos_id=2, eos_id=3, minloglevel=2, **options)
    return model.getvalue()


@pytest.fixture(scope="module")
def proto() -> bytes:
    return trained("bpe")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return lines("de", 3000) + ["Ein Mann mit ÆØÅ-Zeichen ☃ und  doppelten   Leerzeichen. ", ""]


def test_alpha_zero_is_sentencepieces_segmentation(proto, texts):
    sp = spm.SentencePieceProcessor(model_proto=proto)
    dropout = BpeDropout(proto)
    ours = [dropout.encode(t, None, 0.0) for t in texts]
    assert ours == sp.encode(texts, out_type=str)  # unknown runs ("ÆØÅ", "☃") as their text, as SentencePiece
    assert Tokenizer(proto).encode_sampled(texts, 0.0, seed=1) == sp.encode(texts)  # and as ids
    assert ours[-2][3:6] == ["▁", "ÆØÅ", "-"] and sp.encode(texts[-2])[4] == sp.unk_id()


def test_user_defined_pieces_stay_whole_as_in_sentencepiece(texts):
    """A tag (data.train_tags makes them user-defined pieces) wherever the text holds it: alone, leading, inside a
    word; at alpha 0 as SentencePiece splits, and never broken by a draw."""
    proto = trained("bpe", user_defined_symbols=["<BT>", "<2de>"])
    sp = spm.SentencePieceProcessor(model_proto=proto)
    tagged = ["<BT> " + t for t in texts[:300]] + ["Ein<BT>Mann <2de>", "<2de><BT>", "ein Hund<BT>", "<BT>"]
    dropout = BpeDropout(proto)
    assert [dropout.encode(t, None, 0.0) for t in tagged] == sp.encode(tagged, out_type=str)
    for text in tagged:
        sampled = dropout.encode(text, random.Random(text), 0.5)
        assert sampled.count("<BT>") == text.count("<BT>") and sampled.count("<2de>") == text.count("<2de>")


def test_alpha_lengthens_as_sentencepieces_sampler_does_and_one_leaves_no_merge(proto, texts):
    sp = spm.SentencePieceProcessor(model_proto=proto)
    tokenizer = Tokenizer(proto)
    plain = sum(map(len, sp.encode(texts)))
    ours = sum(map(len, tokenizer.encode_sampled(texts, 0.1, seed=7)))
    theirs = sum(map(len, sp.encode(texts, enable_sampling=True, alpha=0.1, nbest_size=-1)))
    assert ours / plain > 1.1 and ours / plain == pytest.approx(theirs / plain, abs=0.03)
    dropout = BpeDropout(proto)
    for text in texts[:200]:  # every merge dropped: a piece per character of the normalized text
        assert dropout.encode(text, random.Random(0), 1.0) == list(sp.normalize(text))


def test_a_sample_is_the_same_in_another_process(proto, texts, tmp_path):
    """Two fresh interpreters and this one draw the same ids for the same seed; another seed draws others."""
    (tmp_path / "spm.model").write_bytes(proto)
    (tmp_path / "texts.json").write_text(json.dumps(texts[:500]), encoding="utf-8")
    code = ("import json, sys; from pathlib import Path; from transformer_nmt.data.tokenizer import Tokenizer; "
            "d = Path(sys.argv[1]); t = Tokenizer.load(d / 'spm.model'); "
            "print(json.dumps(t.encode_sampled(json.loads((d / 'texts.json').read_text()), 0.1, seed=11)))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, capture_output=True,
                                      text=True).stdout) for _ in range(2)]
    here = Tokenizer(proto).encode_sampled(texts[:500], 0.1, seed=11)
    assert runs[0] == runs[1] == here
    assert Tokenizer(proto).encode_sampled(texts[:500], 0.1, seed=12) != here


def test_vocabularies_it_does_not_replay_are_refused_naming_why():
    with pytest.raises(ValueError, match="this one is unigram .*data.spm_model_type=bpe"):
        BpeDropout(trained("unigram"))
    with pytest.raises(ValueError, match="with byte_fallback, split_by_whitespace=false"):
        BpeDropout(trained("bpe", byte_fallback=True, split_by_whitespace=False))
