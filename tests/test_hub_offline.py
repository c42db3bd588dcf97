"""The path a user with the real WMT14 follows, offline: ``data=wmt14_en_de data.hub_name=DIR`` with DIR a
``save_to_disk`` directory in the Hub's schema (a ``translation`` column; splits train, validation, test)
runs through ``prepare`` and a training step. CI-sized: a Multi30k slice stands in for the 4.5M pairs."""

import gzip
from pathlib import Path

import datasets
from hydra import compose, initialize_config_dir

from transformer_nmt.conf import CONF_DIR
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.prepare import format_statistics
from transformer_nmt.training.app import train
from transformer_nmt.training.config import register_configs

MULTI30K = Path(__file__).resolve().parents[1] / "data" / "multi30k"


def save_hub_like(directory: Path) -> Path:
    splits = {}
    for split, source, n in (("train", "train", 400), ("validation", "val", 30), ("test", "test_2016_flickr", 30)):
        sides = {}
        for lang in ("en", "de"):
            with gzip.open(MULTI30K / f"{source}.{lang}.gz", "rt", encoding="utf-8") as f:
                sides[lang] = [next(f).rstrip("\n") for _ in range(n)]
        if split == "train":
            sides["de"][7] = sides["de"][7].replace(" ", "\x00", 1)  # a NUL, cleaned as the WMT config says
        rows = [{"de": d, "en": e} for d, e in zip(sides["de"], sides["en"])]
        splits[split] = datasets.Dataset.from_dict({"translation": rows})
    datasets.DatasetDict(splits).save_to_disk(str(directory))
    return directory


def test_wmt14_config_on_a_saved_hub_directory_prepares_and_trains_a_step(tmp_path):
    hub_dir = save_hub_like(tmp_path / "wmt14")
    overrides = ["data=wmt14_en_de", f"data.hub_name={hub_dir}", f"data.cache_dir={tmp_path}/cache",
                 "data.vocab_size=300", "data.num_proc=1", "data.input_sentence_size=1000"]
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        prepare_cfg = compose("prepare", overrides=overrides)
        train_cfg = compose("train", overrides=overrides + [
            "model=tiny", "model.max_positions=1024", "trainer=cpu", "trainer.max_steps=1",
            "trainer.enable_progress_bar=false", "train.val_bleu_max_sentences=0", "run_test=false",
            "attention_maps.every_n_validations=0"])
    assert (prepare_cfg.data.max_tokens, prepare_cfg.data.max_length_ratio) == (25000, 1.5)  # the paper's setting

    dm = TranslationDataModule(prepare_cfg.data)
    dm.setup()
    out = format_statistics(dm, 0.0)
    assert "corpus: hub en->de" in out and "1 sentences with control characters replaced by spaces" in out
    assert dm.splits["train"].report.total == 400 and dm.splits["val"].report.total == 30
    assert "\x00" not in dm.sources("train")[7] + dm.references("train")[7]

    trainer = train(train_cfg, tmp_path / "run")
    assert trainer.global_step == 1
    assert not any(s.tokenized_now for s in trainer.datamodule.splits.values())  # prepare's caches reused
