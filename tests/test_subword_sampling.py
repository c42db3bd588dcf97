"""Subword regularization (data.spm_alpha, data/subword_sampling.py): an epoch's segmentation is a function of (seed,
epoch) alone, every sample spells its sentence, batches keep the token bound under the epoch's own lengths, every pair
is seen once per epoch, validation is never sampled, and a run resumed mid-epoch reads what it would have read."""


import numpy as np
import pytest
from tiny_corpus import write_train_slices

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.subword_sampling import epoch_seed, take_rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first 1,500 Multi30k training pairs as train, the next 100 as val (plain text files)."""
    return write_train_slices(tmp_path_factory.mktemp("sampling"), train=(0, 1500), val=(1500, 1600))


def datamodule(corpus, seed=3, **changes) -> TranslationDataModule:
    options = dict(train=str(corpus / "train"), val=str(corpus / "val"), test=None, vocab_size=400, max_tokens=600,
                   spm_alpha=0.1, cache_dir=str(corpus / "cache"), num_proc=1)
    dm = TranslationDataModule(DataConfig(**{**options, **changes}), seed=seed)
    dm.setup()
    return dm


def as_lists(ragged):
    flat, offsets = ragged
    return [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def test_an_epoch_is_a_function_of_seed_and_epoch(corpus):
    first, again, other_seed = datamodule(corpus), datamodule(corpus), datamodule(corpus, seed=4)
    epoch0 = [as_lists(r) for r in first.segmentation().epoch(0)]
    assert [as_lists(r) for r in again.segmentation().epoch(0)] == epoch0  # a fresh process draws the same
    assert [as_lists(r) for r in first.segmentation().epoch(1)] != epoch0  # drawn anew each epoch
    assert [as_lists(r) for r in other_seed.segmentation().epoch(0)] != epoch0
    assert [as_lists(r) for r in first.segmentation().epoch(0)] == epoch0  # asked again, after another epoch
    assert epoch_seed(3, 0) != epoch_seed(3, 1) != epoch_seed(4, 1)


def test_every_sample_spells_its_sentence_and_splits_more_than_the_deterministic_one(corpus):
    dm = datamodule(corpus)
    src, tgt = (as_lists(r) for r in dm.segmentation().epoch(0))
    sources, references = dm.sources("train"), dm.references("train")
    assert [dm.tokenizer.decode(ids) for ids in tgt] == [" ".join(r.split()) for r in references]
    assert [dm.tokenizer.decode(ids) for ids in src] == [" ".join(s.split()) for s in sources]
    plain = np.diff(dm._kept_ids(dm.splits["train"], "de")[1])
    sampled = np.array([len(ids) for ids in tgt])
    assert sampled.mean() > 1.1 * plain.mean()  # BPE-dropout at 0.1 leaves merges out: more, shorter pieces
    assert not dm.segmentation().fallbacks[0]


def test_batches_hold_the_token_bound_of_the_epochs_lengths_and_every_pair_once(corpus):
    dm = datamodule(corpus)
    loader = dm.train_dataloader()
    for epoch in (0, 1):
        src, tgt = dm.segmentation().epoch(epoch)
        seen = []
        for batch in loader:  # each full pass advances the epoch
            index = batch["index"].tolist()
            seen += index
            assert batch["src"].numel() <= 600 and batch["tgt"].numel() <= 600
            expected_src, expected_tgt = take_rows(src, index), take_rows(tgt, index)
            for row, i in enumerate(index):  # the ids are the epoch's samples, + eos / bos ... eos
                s = as_lists(expected_src)[row]
                t = as_lists(expected_tgt)[row]
                assert batch["src"][row, :len(s) + 1].tolist() == s + [3]
                assert batch["tgt"][row, :len(t) + 2].tolist() == [2] + t + [3]
        assert sorted(seen) == list(range(len(dm.segmentation())))


def test_validation_is_never_sampled(corpus):
    sampled, plain = datamodule(corpus), datamodule(corpus, spm_alpha=0.0)
    assert plain.segmentation() is None
    a_batches, b_batches = list(sampled.dataloader("val")), list(plain.dataloader("val"))
    assert len(a_batches) == len(b_batches) > 0  # zip() alone would pass a loader that stops early
    for a, b in zip(a_batches, b_batches):
        assert all(a[k].equal(b[k]) for k in ("src", "tgt", "index"))


def test_a_run_resumed_mid_epoch_reads_what_an_uninterrupted_one_reads(corpus):
    uninterrupted = [b for _, b in zip(range(12), iter(datamodule(corpus).train_dataloader()))]
    first = datamodule(corpus).train_dataloader()
    batches = iter(first)
    for _ in range(5):
        next(batches)
    state = first.state_dict()
    resumed_loader = datamodule(corpus).train_dataloader()  # a new process: nothing cached
    resumed_loader.load_state_dict(state)
    resumed = [b for _, b in zip(range(7), iter(resumed_loader))]
    assert len(uninterrupted) == 12 and len(resumed) == 7  # the corpus holds more than 12 batches an epoch
    for a, b in zip(uninterrupted[5:], resumed):
        assert all(a[k].equal(b[k]) for k in ("src", "tgt", "index"))


def test_a_sample_too_long_for_the_positions_keeps_the_deterministic_ids(corpus):
    plain = datamodule(corpus, spm_alpha=0.0, max_positions=30)
    dm = datamodule(corpus, max_positions=30)
    kept = [as_lists(dm._kept_ids(dm.splits["train"], lang)) for lang in ("en", "de")]
    src, tgt = (as_lists(r) for r in dm.segmentation().epoch(0))
    assert dm.segmentation().fallbacks[0] > 0
    for s, t, ks, kt in zip(src, tgt, *kept):
        assert max(len(s), len(t)) + 1 <= 30  # source + eos, bos + target: the filter's rule (corpus.filter_pairs)
    assert sum((s, t) != (ks, kt) for s, t, ks, kt in zip(src, tgt, *kept)) > len(src) // 2  # the rest sampled
    assert len(dm.segmentation()) == len(plain.sources("train"))


def test_bad_options_are_refused_naming_them(corpus):
    with pytest.raises(ValueError, match=r"data.spm_alpha=1.5"):
        datamodule(corpus, spm_alpha=1.5).segmentation()
    with pytest.raises(ValueError, match=r"data.num_workers=0"):
        datamodule(corpus, num_workers=1).segmentation()
    with pytest.raises(ValueError, match=r"data.spm_alpha=0.1: .*data.spm_model_type=bpe"):
        datamodule(corpus, spm_model_type="unigram", cache_dir=str(corpus / "cache_unigram")).segmentation()


def test_a_sample_wider_than_the_token_bound_keeps_the_deterministic_ids(corpus):
    """data.max_tokens just the widest deterministic pair (below max_positions + 1): a sampled segmentation is longer,
    and an epoch would hold a pair wider than a batch may be (the run stopped mid-run); such a pair keeps its
    deterministic ids, every epoch's widths stay within the bound, and every batch holds it."""
    plain = datamodule(corpus, spm_alpha=0.0)
    src, tgt = (np.diff(plain._kept_ids(plain.splits["train"], lang)[1]) for lang in ("en", "de"))
    widest = int(np.maximum(src + 1, tgt + 2).max())
    assert widest + 1 < plain.max_positions
    dm = datamodule(corpus, max_tokens=widest)
    for epoch in (0, 1, 2):
        assert int(dm.segmentation().widths(epoch).max()) <= widest
        assert dm.segmentation().fallbacks[epoch] > 0
    for batch in dm.train_dataloader():
        assert batch["src"].numel() <= widest and batch["tgt"].numel() <= widest
