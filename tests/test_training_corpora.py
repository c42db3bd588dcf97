"""Several training corpora as one training set (data.train=[A,B,...], data.train_upsample, data.train_tags): each
corpus's kept pairs enter an epoch as often as its factor says, a tagged corpus's sources start with its tag as one
piece (also in a sampled segmentation), the rest of each source is its untagged tokenization, mismatched options are
refused naming them, and the run's fingerprint sees every corpus's files."""

from collections import Counter

import numpy as np
import pytest
from tiny_corpus import write_train_slices

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.training.fingerprint import _split_digest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Multi30k's first 400 training pairs as corpus a, the next 300 as corpus b, the next 50 as val."""
    return write_train_slices(tmp_path_factory.mktemp("corpora"), a=(0, 400), b=(400, 700), val=(700, 750))


def datamodule(corpus, **changes) -> TranslationDataModule:
    options = dict(train=[str(corpus / "a"), str(corpus / "b")], val=str(corpus / "val"), test=None, vocab_size=400,
                   max_tokens=600, cache_dir=str(corpus / "cache"), num_proc=1)
    dm = TranslationDataModule(DataConfig(**{**options, **changes}), seed=3)
    dm.setup()
    return dm


def kept_rows(dm) -> list[int]:
    """The row of the combined table (a's rows, then b's) of each pair of an epoch."""
    return np.asarray(dm.splits["train"].keep).tolist()


def source_ids(dm, positions) -> list[list[int]]:
    batch = dm.train_dataloader().dataset.__getitems__(list(positions))
    return [[i for i in row if i not in (0, dm.tokenizer.eos_id)] for row in batch["src"].tolist()]


def test_each_corpus_enters_an_epoch_as_often_as_its_factor(corpus):
    dm = datamodule(corpus, train_upsample=[3, 1])
    counts = Counter(kept_rows(dm))
    assert sorted(counts) == list(range(700))  # no pair of either corpus filtered out of these short sentences
    assert all(counts[row] == 3 for row in range(400)) and all(counts[row] == 1 for row in range(400, 700))
    assert len(dm.splits["train"].keep) == len(dm.splits["train"].widths) == 3 * 400 + 300
    assert dm.splits["train"].report.total == 700  # the filter counts each pair once
    sampler = dm.batch_sampler("train")
    dealt = np.concatenate(sampler.epoch_batches(0))
    assert sorted(dealt.tolist()) == list(range(1500))  # every position of the epoch, once


def test_a_list_of_one_corpus_is_that_corpus(corpus):
    listed, plain = datamodule(corpus, train=[str(corpus / "a")]), datamodule(corpus, train=str(corpus / "a"))
    assert kept_rows(listed) == kept_rows(plain) and listed.tokenizer == plain.tokenizer
    assert source_ids(listed, range(20)) == source_ids(plain, range(20))


def test_a_tagged_corpus_leads_with_its_tag_as_one_piece(corpus):
    dm = datamodule(corpus, train_tags=[None, "<BT>"])
    tag = dm.tokenizer.piece_id("<BT>")
    assert tag is not None and dm.tokenizer.id_to_piece(tag) == "<BT>"
    rows = kept_rows(dm)
    sources = dm.sources("train")  # the raw sentences, untagged
    ids = source_ids(dm, range(len(rows)))
    for position, row in enumerate(rows):
        expected = dm.tokenizer.encode(sources[position])  # the untagged tokenization, as translate sees it
        assert ids[position] == ([tag] if row >= 400 else []) + expected
    assert dm.splits["train"].source_tags.tolist() == [tag if row >= 400 else -1 for row in rows]
    untagged = datamodule(corpus)  # the tag is a piece only where a corpus carries it
    assert untagged.tokenizer.piece_id("<BT>") is None


def test_a_sampled_segmentation_keeps_the_tag_in_front(corpus):
    dm = datamodule(corpus, train_tags=["<T1>", "<T2>"], spm_alpha=0.1)
    t1, t2 = dm.tokenizer.piece_id("<T1>"), dm.tokenizer.piece_id("<T2>")
    flat, offsets = dm.segmentation().epoch(0)[0]
    rows = kept_rows(dm)
    sources = dm.sources("train")
    for position, row in enumerate(rows):
        sample = flat[offsets[position]:offsets[position + 1]].tolist()
        assert sample[0] == (t1 if row < 400 else t2)
        assert dm.tokenizer.decode(sample[1:]) == " ".join(sources[position].split())


@pytest.mark.parametrize("changes, message", [
    (dict(train_upsample=[2]), r"data.train_upsample=\[2\]: give one value per data.train corpus \(2"),
    (dict(train_tags=["<BT>"]), r"data.train_tags=\['<BT>'\]: give one value per data.train corpus"),
    (dict(train_upsample=[0, 1]), r"data.train_upsample=\[0, 1\]: each factor is a whole number >= 1"),
    (dict(train_tags=[None, "a tag"]), r"data.train_tags=.*not 'a tag'"),
])
def test_options_that_do_not_fit_the_corpora_are_refused_naming_them(corpus, changes, message):
    with pytest.raises(ValueError, match=message):
        datamodule(corpus, **changes)


@pytest.mark.parametrize("tag, message", [
    ("<unk>", r"'<unk>' is a special piece of the vocabulary"),
    ("</s>", r"'</s>' is a special piece of the vocabulary"),
    ("in", r"'in' occurs in the (en|de) text of data.train corpus .*/a: a tag must be a token no sentence holds"),
])
def test_a_tag_that_is_special_or_occurs_in_the_text_is_refused(corpus, tag, message):
    with pytest.raises(ValueError, match=message):
        datamodule(corpus, train_tags=[None, tag])


def test_a_tagged_corpus_is_filtered_on_its_own_sentences(corpus, tmp_path):
    """An empty source stays empty under a tag (dropped as empty), and the tag counts in no length ratio."""
    for lang, extra in (("en", ["", "One two three four five six seven eight nine ten."]), ("de", ["Leer.", "Eins."])):
        lines = (corpus / f"b.{lang}").read_text().splitlines()[:50] + extra
        (tmp_path / f"c.{lang}").write_text("\n".join(lines) + "\n")
    tagged = datamodule(corpus, train=[str(corpus / "a"), str(tmp_path / "c")], train_tags=[None, "<BT>"],
                        max_length_ratio=None, cache_dir=str(tmp_path / "cache"))
    plain = datamodule(corpus, train=[str(corpus / "a"), str(tmp_path / "c")], max_length_ratio=None,
                       cache_dir=str(tmp_path / "cache"))
    assert tagged.splits["train"].report.empty == plain.splits["train"].report.empty == 1
    assert kept_rows(tagged) == kept_rows(plain)
    widths = np.asarray(tagged.splits["train"].widths) - np.asarray(plain.splits["train"].widths)
    assert set(widths.tolist()) <= {0, 1}  # batches sized with the tag where it makes the source the wider side


def test_a_corpus_listed_twice_is_refused(corpus):
    with pytest.raises(ValueError, match=r"a corpus is listed twice; upsample it with data.train_upsample"):
        datamodule(corpus, train=[str(corpus / "a"), str(corpus / "a")])


def test_a_tag_the_given_vocabulary_lacks_is_refused(corpus):
    trained = datamodule(corpus)  # a vocabulary without the tag
    with pytest.raises(ValueError, match=r"data.train_tags: '<BT>' is not a piece of data.tokenizer_path="):
        datamodule(corpus, train_tags=[None, "<BT>"], tokenizer_path=str(trained.tokenizer_path_used))


def test_the_fingerprint_reads_every_corpus(corpus, tmp_path):
    """The training files' digest covers each corpus: pairs appended to the second one make another run."""
    from omegaconf import OmegaConf

    for name in ("a", "b"):
        for lang in ("en", "de"):
            (tmp_path / f"{name}.{lang}").write_bytes((corpus / f"{name}.{lang}").read_bytes())
    cfg = OmegaConf.create({"data": {"train": [str(tmp_path / "a"), str(tmp_path / "b")], "val": "v", "test": None}})
    before = _split_digest(cfg)
    assert before is not None
    with open(tmp_path / "b.en", "a") as f_en, open(tmp_path / "b.de", "a") as f_de:
        f_en.write("One more.\n")
        f_de.write("Noch einer.\n")
    assert _split_digest(cfg) != before


def test_a_tag_is_matched_in_the_text_as_sentencepiece_reads_it(corpus, tmp_path):
    """SentencePiece normalizes text with NFKC before it matches a piece: a fullwidth ＜BT＞ in a sentence is the tag
    <BT> there, so it is refused as occurring in the text; a tag that NFKC changes is refused naming its form."""
    for lang in ("en", "de"):
        lines = (corpus / f"b.{lang}").read_text().splitlines()[:50]
        if lang == "en":
            lines[7] = "A sign reads ＜BT＞ in fullwidth letters."
        (tmp_path / f"c.{lang}").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"'<BT>' occurs in the en text of data.train corpus .*/c: .*compared after "
                                         r"NFKC normalization"):
        datamodule(corpus, train=[str(corpus / "a"), str(tmp_path / "c")], train_tags=[None, "<BT>"],
                   cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"'＜BT＞' changes under NFKC normalization \(to '<BT>'\)"):
        datamodule(corpus, train_tags=[None, "＜BT＞"])
