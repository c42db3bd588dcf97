"""The shared SentencePiece vocabulary: fixed special ids, round trips, serialization, batched tokenization."""

import pickle

import datasets
import pytest
from toy_sentences import sentences

from transformer_nmt.data.tokenizer import Tokenizer, tokenize_dataset, train_sentencepiece


@pytest.fixture(scope="module")
def tokenizer():
    return train_sentencepiece(iter(sentences()), vocab_size=120, seed=1)


def test_special_ids_are_fixed(tokenizer):
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert 50 < tokenizer.vocab_size <= 120


def test_encode_decode_round_trip_without_bos_eos(tokenizer):
    text = "the big dog sleeps under der Katze"
    ids = tokenizer.encode(text)
    assert ids and all(i > 3 for i in ids)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([2] + ids + [3, 0, 0]) == text  # specials dropped
    assert tokenizer.encode_batch([text, "red tree"], num_threads=2) == [ids, tokenizer.encode("red tree")]


def test_serialization(tokenizer, tmp_path):
    again = Tokenizer.from_proto(tokenizer.model_proto)
    tokenizer.save(tmp_path / "spm.model")
    loaded = Tokenizer.load(tmp_path / "spm.model")
    unpickled = pickle.loads(pickle.dumps(tokenizer))
    for other in (again, loaded, unpickled):
        assert other.encode("green house") == tokenizer.encode("green house")


def test_unigram_and_sampled_training_are_deterministic():
    a = train_sentencepiece(iter(sentences()), vocab_size=100, model_type="unigram", input_sentence_size=200, seed=3)
    b = train_sentencepiece(iter(sentences()), vocab_size=100, model_type="unigram", input_sentence_size=200, seed=3)
    assert a.model_proto == b.model_proto
    with pytest.raises(ValueError, match="spm_model_type"):
        train_sentencepiece(iter(sentences()), vocab_size=100, model_type="word")


@pytest.mark.parametrize("num_proc", [1, 2])
def test_tokenize_dataset_writes_ids_and_lengths(tokenizer, tmp_path, num_proc):
    en, de = sentences(20_000, seed=1), sentences(20_000, seed=2)
    raw = datasets.Dataset.from_dict({"en": en, "de": de})
    tokens = tokenize_dataset(raw, tokenizer, ("en", "de"), tmp_path / "tokens.arrow", num_proc=num_proc)
    assert len(tokens) == 20_000 and len(tokens.cache_files) == num_proc
    assert all(str(tmp_path) in f["filename"] for f in tokens.cache_files)
    row = tokens[7]
    assert row["en_ids"] == tokenizer.encode(en[7]) and row["de_ids"] == tokenizer.encode(de[7])
    assert row["en_len"] == len(row["en_ids"])
