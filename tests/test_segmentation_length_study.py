"""studies/segmentation_length.py counts what a training epoch holds: its deterministic pieces are SentencePiece's own
count, its sampled target pieces are exactly those of epoch 0 of a run with data.spm_alpha (the datamodule's
SampledSegmentation, same seed), and more merges dropped means more pieces and fewer sentences left unchanged."""

import json

import pytest
import sentencepiece as spm
from study_scripts import load_study
from tiny_corpus import write_train_slices

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first 800 Multi30k training pairs (plain text files), 50 more as val."""
    return write_train_slices(tmp_path_factory.mktemp("segmentation"), train=(0, 800), val=(800, 850))


def test_the_counts_are_what_a_training_epoch_holds(corpus, tmp_path):
    seed, alpha = 5, 0.1
    dm = TranslationDataModule(DataConfig(train=str(corpus / "train"), val=str(corpus / "val"), test=None,
                                          vocab_size=300, max_tokens=600, spm_alpha=alpha,
                                          cache_dir=str(corpus / "cache"), num_proc=1), seed=seed)
    dm.setup()
    assert len(dm.segmentation()) == 800  # no pair filtered: the epoch holds every line the study reads
    model = tmp_path / "spm.model"
    dm.tokenizer.save(model)
    out = tmp_path / "study.json"
    result = load_study("segmentation_length").main([f"tokenizer={model}", f"train={corpus / 'train'}",
                                                     "alphas=[0.02,0.1,0.3]", f"seed={seed}", f"out={out}"])
    assert json.loads(out.read_text()) == result
    rows = {(r["lang"], r["alpha"]): r for r in result["rows"]}
    assert len(rows) == 6
    sp = spm.SentencePieceProcessor(model_file=str(model))
    for lang in ("en", "de"):
        text = (corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        plain = sum(map(len, sp.encode(text)))
        assert all(rows[(lang, a)]["pieces_deterministic"] == plain for a in (0.02, 0.1, 0.3))
        ratios = [rows[(lang, a)]["ratio"] for a in (0.02, 0.1, 0.3)]
        unchanged = [rows[(lang, a)]["unchanged_share"] for a in (0.02, 0.1, 0.3)]
        assert 1.0 < ratios[0] < ratios[1] < ratios[2] and unchanged[0] > unchanged[1] > unchanged[2]
    _, (flat, offsets) = dm.segmentation().epoch(0)  # the target side of the run's first sampled epoch
    assert rows[("de", alpha)]["pieces_sampled"] == int(offsets[-1]) == len(flat)


def test_bad_options_are_refused_naming_them(tmp_path):
    study = load_study("segmentation_length")
    with pytest.raises(SystemExit, match="give tokenizer="):
        study.main([f"out={tmp_path / 'x.json'}"])
    with pytest.raises(SystemExit, match=r"alphas=\[0.1, 1.5\].*not \[1.5\]"):
        study.main(["tokenizer=x.model", "alphas=[0.1,1.5]"])
    with pytest.raises(SystemExit, match="tokenizer=.*nothere.model: no such file"):
        study.main([f"tokenizer={tmp_path / 'nothere.model'}"])
    (tmp_path / "spm.model").write_bytes(b"")  # the corpus is read before the tokenizer: its error comes first
    with pytest.raises(SystemExit, match=r"no file .*missing\.en or .*missing\.en\.gz"):
        study.main([f"tokenizer={tmp_path / 'spm.model'}", f"train={tmp_path / 'missing'}"])
