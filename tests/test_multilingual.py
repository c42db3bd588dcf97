"""Many languages in one model (data.pairs): the tags' rule, temperature sampling, the multilingual splits, and a
tiny model trained here to write each target language in its own alphabet, translated by direction.

The toy languages: English words over the letters a-f; German, French and Czech spell each English sentence letter
for letter in their own six letters (g-l, m-r, s-x). A model that has learnt the tags writes French in m-r and
Czech in s-x for the same English input: the output's language is read off its letters.
"""

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensorboard_events import read_events
from toy_languages import ALPHABETS, PAIRS, write_toy_languages

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.language_tags import LanguageTags, parse_pairs
from transformer_nmt.data.pair_sampling import epoch_counts, epoch_draw, epoch_rows, temperature_shares
from transformer_nmt.inference.translate import main as translate_main


def toy_config(corpus: Path, **changes) -> DataConfig:
    return DataConfig(**{"train": str(corpus / "train"), "val": str(corpus / "val"), "test": str(corpus / "test"),
                         "pairs": PAIRS, "cache_dir": str(corpus / "cache"), "vocab_size": 60, "num_proc": 1,
                         "max_tokens": 1024, **changes})


def letters_of(text: str) -> str:
    return "".join(c for c in text if c.isalpha())


# --- the rule -------------------------------------------------------------------------------------------------


def test_the_rule_spells_each_style_and_refuses_what_it_cannot_mean():
    pairs = tuple(parse_pairs(["en-de", "en-fr", "de-en"]))
    assert LanguageTags(pairs).pieces() == ["<2de>", "<2en>", "<2fr>"]
    assert LanguageTags(pairs, "decoder").pieces() == ["<de>", "<en>", "<fr>"]
    decoder = LanguageTags(pairs, "decoder")
    assert (decoder.source_piece("de", "en"), decoder.decoder_piece("en")) == ("<de>", "<en>")
    assert LanguageTags((("de", "en"), ("fr", "en")), "source").pieces() == ["<de>", "<fr>"]
    with pytest.raises(ValueError, match="one target language only|several target languages"):
        LanguageTags(pairs, "source")
    for bad in (["en-en"], ["en_de"], "en-de", ["en-de", "en-de"], ["src-de"]):
        with pytest.raises(ValueError, match="data.pairs"):
            parse_pairs(bad)
    assert LanguageTags.of({"src_lang": "en", "tgt_lang": "de"}) is None  # one pair, as every older checkpoint


def test_a_direction_is_chosen_refused_or_allowed_zero_shot():
    tags = LanguageTags(tuple(parse_pairs(["en-de", "en-fr", "de-en"])))
    assert tags.direction(None, "fr").name == "en-fr"
    assert tags.direction("de", None).name == "de-en"
    with pytest.raises(ValueError, match=r"not trained on de-fr; it knows en-de, en-fr, de-en"):
        tags.direction("de", "fr")
    zero = tags.direction("de", "fr", zero_shot=True)
    assert zero.zero_shot and zero.record() == {"src_lang": "de", "tgt_lang": "fr", "zero_shot": True}
    with pytest.raises(ValueError, match="no tag for cs"):
        tags.direction("en", "cs", zero_shot=True)
    with pytest.raises(ValueError, match="give tgt_lang= .one of de, fr."):
        tags.direction("en", None)


# --- temperature sampling -------------------------------------------------------------------------------------


def test_temperature_one_is_proportional_and_five_flattens():
    sizes = [9000, 900, 100]
    assert epoch_counts(sizes, 1.0) == sizes
    counts = epoch_counts(sizes, 5.0)
    assert sum(counts) == sum(sizes)
    shares = np.array(sizes, dtype=float) ** 0.2 / (np.array(sizes, dtype=float) ** 0.2).sum()
    np.testing.assert_allclose(temperature_shares(sizes, 5.0), shares, rtol=1e-12)
    assert all(abs(c - s * sum(sizes)) <= 1 for c, s in zip(counts, shares))  # largest remainders: within 1
    assert counts[2] > 10 * 100 and counts[0] < 9000  # the small pair repeated, the large one subsampled
    assert epoch_counts([500, 500, 500], 5.0) == [500, 500, 500]  # equal sizes: uniform at any temperature
    rows = epoch_rows(100, 1234, seed=3, epoch=0, pair_index=2)
    assert len(rows) == 1234 and np.bincount(rows, minlength=100).min() == 12  # 12 whole copies, 34 drawn once more
    assert (np.bincount(rows, minlength=100) == 13).sum() == 34
    np.testing.assert_array_equal(rows, epoch_rows(100, 1234, seed=3, epoch=0, pair_index=2))
    assert not np.array_equal(rows, epoch_rows(100, 1234, seed=3, epoch=1, pair_index=2))  # drawn anew each epoch
    assert epoch_draw([9000, 900, 100], 1.0, seed=3) is None and epoch_draw([50, 50], 5.0, seed=3) is None
    with pytest.raises(ValueError, match="pair_temperature"):
        temperature_shares(sizes, 0)


def test_the_multilingual_splits_tag_mix_and_sample_pairs(tmp_path):
    corpus = write_toy_languages(tmp_path / "toy", n_train=200, sizes={"en-de": 200, "en-fr": 200, "en-cs": 50})
    corpus_of_pairs = {split: str(corpus / "{pair}" / split) for split in ("train", "val", "test")}
    dm = TranslationDataModule(toy_config(corpus, pair_temperature=5.0, **corpus_of_pairs))
    dm.setup()
    tok = dm.tokenizer
    tags = {t: tok.piece_id(f"<2{t}>") for t in ("de", "fr", "cs")}
    assert all(i is not None for i in tags.values())
    train = dm.splits["train"]
    assert np.bincount(train.pair_of, minlength=3).tolist() == [200, 200, 50]  # the pool: each kept pair once
    counts = np.bincount(train.pair_of[train.draw.members(0)], minlength=3)  # an epoch: its members
    assert counts.tolist() == epoch_counts([200, 200, 50], 5.0) and counts.sum() == 450 == train.epoch_pairs
    # each index's position in its direction's part: what validation's sentence limit counts per direction
    positions = dm.pair_positions("train")
    for group in dm.pair_indices("train").values():
        assert positions[group].tolist() == list(range(len(group)))
    assert dm.pair_positions("train") is positions  # computed once per prepared split
    # every source is led by its pair's tag; every target spelled in its language's letters
    for pair, group in dm.pair_indices("val").items():
        tgt = pair.split("-")[1]
        for i in group[:3].tolist():
            row = dm.dataloader("val").dataset.__getitem__(i)
            assert row["src"][0] == tags[tgt] and tags[tgt] not in row["src"][1:]
            assert set(letters_of(dm.references("val")[i])) <= set(ALPHABETS[tgt])
    dealt = [b for b in dm.batch_sampler("train")]
    assert any(len(set(train.pair_of[b])) > 1 for b in dealt)  # batches mix pairs
    assert sorted(i for b in dealt for i in b) == sorted(train.draw.members(0).tolist())  # epoch 0 deals its draw
    # T=1: each kept pair exactly once, as the corpora concatenated
    dm1 = TranslationDataModule(toy_config(corpus, **corpus_of_pairs))
    dm1.setup()
    assert np.bincount(dm1.splits["train"].pair_of).tolist() == [200, 200, 50] and dm1.splits["train"].draw is None
    assert sorted(dm1.splits["train"].keep.tolist()) == sorted(set(dm1.splits["train"].keep.tolist()))


@pytest.mark.parametrize("style", ["target", "decoder"])
def test_training_and_translate_tag_by_one_rule(tmp_path, style):
    """The ids a model trains and validates on are those translate gives it for the same sentence: each pair's val
    rows (tagged in the cache by language_tags.LeadWith) equal Direction.encode's source ids and, style decoder,
    the forced prefix before the target's; a corpus tag (data.train_tags) goes through the same rule."""
    from transformer_nmt.data.language_tags import led_by

    corpus = write_toy_languages(tmp_path / "toy", n_train=60)
    dm = TranslationDataModule(toy_config(corpus, lang_tags=style))
    dm.setup()
    tags, tok, dataset = dm.language_tags(), dm.tokenizer, dm.dataloader("val").dataset
    for pair, group in dm.pair_indices("val").items():
        direction = tags.direction(*pair.split("-"))
        for i in group[:4].tolist():
            row = dataset[i]
            assert row["src"] == direction.encode(tok, [dm.sources("val")[i]])[0]
            assert row["tgt"] == direction.decoder_prefix(tok) + tok.encode(dm.references("val")[i], target=True)
    second = write_toy_languages(tmp_path / "bt", n_train=30)
    one = TranslationDataModule(DataConfig(train=[str(corpus / "train"), str(second / "train")],
                                           train_tags=[None, "<BT>"],
                                           val=str(corpus / "val"), test=str(corpus / "test"),
                                           cache_dir=str(tmp_path / "cache1"), vocab_size=60, num_proc=1,
                                           max_tokens=1024))
    one.setup()
    train, bt = one.splits["train"], one.tokenizer.piece_id("<BT>")
    rows = one.dataloader("train").dataset
    tagged = [i for i in range(len(train.keep)) if train.source_tags[i] == bt][:3]
    assert tagged and all(rows[i]["src"] == led_by(bt, one.tokenizer.encode(one.sources("train")[i]))
                          for i in tagged)


def test_options_that_do_not_fit_data_pairs_are_refused(tmp_path):
    corpus = write_toy_languages(tmp_path / "toy", n_train=20)
    for changes, message in (({"train": [str(corpus / "train")] * 2}, "one data.train"),
                             ({"pair_temperature": 0.0}, "pair_temperature"),
                             ({"lang_tags": "both"}, "data.lang_tags"),
                             ({"format": "tsv"}, "data.format=tsv")):
        with pytest.raises(ValueError, match=message):
            TranslationDataModule(toy_config(corpus, **changes))
    with pytest.raises(Exception, match="train.it"):  # a pair's files are found as one pair's: missing, named
        TranslationDataModule(toy_config(corpus, pairs=["en-it"])).setup()


# --- a tiny model that learns the tags -------------------------------------------------------------------------


def train_toy_model(corpus: Path, path: Path, steps: int = 150, **changes) -> None:
    """A tiny Transformer trained on the toy languages' batches (a plain loop: seconds), saved as a checkpoint with
    the tokenizer and data config a training run records."""
    from tiny_checkpoint import write_checkpoint

    from transformer_nmt.checkpoint import CKPT_DATA_CONFIG

    config = toy_config(corpus, **changes)
    dm = TranslationDataModule(config)
    dm.setup()
    torch.manual_seed(0)
    model = write_checkpoint(path, dm.tokenizer, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=2,
                             n_decoder_layers=2, max_positions=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = 0
    model.train()
    while step < steps:
        for batch in dm.train_dataloader():
            logits = model(batch["src"], batch["tgt"][:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch["tgt"][:, 1:].flatten(), ignore_index=0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == steps:
                break
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["state_dict"] = {f"model.{k}": v for k, v in model.state_dict().items()}
    checkpoint[CKPT_DATA_CONFIG] = asdict(config)
    torch.save(checkpoint, path)


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, corpus) of a tiny model for en -> de, fr, cs, tagged <2de> ... (data.lang_tags=target)."""
    root = tmp_path_factory.mktemp("multilingual")
    corpus = write_toy_languages(root / "toy")
    train_toy_model(corpus, root / "toy.ckpt")
    return root / "toy.ckpt", corpus


def translate(tmp_path, ckpt, *options, lines=None) -> list[str]:
    source = tmp_path / "in.en"
    source.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out.txt"
    translate_main([f"ckpt={ckpt}", f"input={source}", f"output={out}", *options])
    return out.read_text().splitlines()


def test_translate_writes_the_language_tgt_lang_names(tmp_path, toy_model):
    ckpt, corpus = toy_model
    lines = (corpus / "test.en").read_text().splitlines()[:8]
    for tgt in ("fr", "cs", "de"):
        outputs = translate(tmp_path, ckpt, f"tgt_lang={tgt}", lines=lines)
        letters = "".join(letters_of(o) for o in outputs)
        assert len(outputs) == len(lines) and len(letters) >= 20, outputs
        inside = sum(c in ALPHABETS[tgt] for c in letters) / len(letters)
        assert inside >= 0.95, (tgt, outputs)  # its own letters, not English's nor another target's


def test_a_direction_the_model_does_not_know_is_refused_naming_those_it_knows(tmp_path, toy_model):
    ckpt, _ = toy_model
    with pytest.raises(SystemExit, match="not trained on en-it; it knows en-de, en-fr, en-cs"):
        translate(tmp_path, ckpt, "tgt_lang=it", lines=["abc"])
    with pytest.raises(SystemExit, match="not trained on de-fr; it knows en-de, en-fr, en-cs"):
        translate(tmp_path, ckpt, "src_lang=de", "tgt_lang=fr", lines=["ghi"])
    with pytest.raises(SystemExit, match="give tgt_lang= .one of cs, de, fr."):
        translate(tmp_path, ckpt, lines=["abc"])


def test_zero_shot_is_allowed_on_request_and_labelled(tmp_path, toy_model, capsys):
    ckpt, corpus = toy_model
    outputs = translate(tmp_path, ckpt, "src_lang=de", "tgt_lang=fr", "zero_shot=true", lines=["ghi jk"])
    assert len(outputs) == 1
    assert "de-fr is a zero-shot direction" in capsys.readouterr().err
    from transformer_nmt.inference.evaluate import main as evaluate_main

    (tmp_path / "src.de").write_text("ghi jk\n")
    (tmp_path / "ref.fr").write_text("mno pq\n")
    result = evaluate_main([f"ckpt={ckpt}", f"src={tmp_path / 'src.de'}", f"ref={tmp_path / 'ref.fr'}",
                            "src_lang=de", "tgt_lang=fr", "zero_shot=true", f"out={tmp_path / 'ev'}"])
    assert result["direction"] == {"src_lang": "de", "tgt_lang": "fr", "zero_shot": True}


def test_evaluate_scores_each_pair_in_one_call(tmp_path, toy_model):
    ckpt, corpus = toy_model
    from transformer_nmt.inference.evaluate import main as evaluate_main

    summary = evaluate_main([f"ckpt={ckpt}", "split=test", "trust_data_paths=true", f"out={tmp_path}", "beam=1"])
    assert list(summary["pairs"]) == PAIRS
    for key in ("bleu", "chrf", "bleu_multi30k"):  # each score's mean over the pairs, under its own name
        assert summary[key] == pytest.approx(sum(p[key] for p in summary["pairs"].values()) / 3, abs=1e-3)
    assert summary["sentences"] == 36 and json.loads((tmp_path / "test.json").read_text())["bleu"] == summary["bleu"]
    for pair in PAIRS:
        tgt = pair.split("-")[1]
        record = json.loads((tmp_path / f"test.{pair}.json").read_text())
        assert record["direction"]["tgt_lang"] == tgt and record["sentences"] == 12
        references = (tmp_path / f"test.{pair}.ref").read_text().splitlines()
        assert references == (corpus / f"test.{tgt}").read_text().splitlines()


def test_decoder_side_tags_are_forced_and_stripped(tmp_path_factory, tmp_path):
    """data.lang_tags=decoder (as mBART/NLLB): <en> before the source, <fr> forced as the first target token; the
    output holds no tag and is in the language asked for."""
    root = tmp_path_factory.mktemp("decoder")
    corpus = write_toy_languages(root / "toy")
    train_toy_model(corpus, root / "toy.ckpt", lang_tags="decoder")
    lines = (corpus / "test.en").read_text().splitlines()[:8]
    for tgt in ("fr", "cs"):
        outputs = translate(tmp_path, root / "toy.ckpt", f"tgt_lang={tgt}", lines=lines)
        assert not any("<" in o for o in outputs), outputs
        letters = "".join(letters_of(o) for o in outputs)
        assert sum(c in ALPHABETS[tgt] for c in letters) / max(len(letters), 1) >= 0.95, (tgt, outputs)
    # explore teacher-forces the decoder with what it read in training: <s> <fr> translation (the tag stripped from
    # the translation shown)
    from transformer_nmt.analysis.explore import attention
    from transformer_nmt.checkpoint import load_checkpoint

    model, tokenizer, meta = load_checkpoint(root / "toy.ckpt")
    direction = LanguageTags.of(meta["data_config"]).direction("en", "fr")
    seen = attention(model, tokenizer, lines[:1], direction=direction).sentences[0]
    assert seen.source_pieces[0] == "<en>" and seen.target_pieces[:2] == ["<s>", "<fr>"]
    assert "<" not in seen.translation and seen.weights["decoder"].shape[-1] == len(seen.target_pieces)


def test_a_one_pair_checkpoint_refuses_another_direction(tmp_path):
    from tiny_checkpoint import tiny_tokenizer, write_checkpoint

    from transformer_nmt.checkpoint import CKPT_DATA_CONFIG

    path = tmp_path / "one.ckpt"
    write_checkpoint(path, tiny_tokenizer())
    assert translate(tmp_path, path, lines=["A dog."])  # no data config (older checkpoints): as ever
    checkpoint = torch.load(path, weights_only=True)
    checkpoint[CKPT_DATA_CONFIG] = {"src_lang": "en", "tgt_lang": "de", "train": "x", "val": "y", "test": None}
    torch.save(checkpoint, path)
    assert translate(tmp_path, path, "tgt_lang=de", lines=["A dog."])
    with pytest.raises(SystemExit, match="trained on one pair, en-de"):
        translate(tmp_path, path, "tgt_lang=fr", lines=["A dog."])


def test_the_experiment_trains_one_model_for_three_targets(tmp_path):
    """``python -m transformer_nmt.train experiment=multi30k_multilingual`` at tiny sizes on the toy languages: the
    checkpoint records its pairs; validation logs BLEU per pair and their mean."""
    corpus = write_toy_languages(tmp_path / "toy", n_train=60, n_eval=6)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.train", "experiment=multi30k_multilingual", "model=tiny",
         f"data.train={corpus}/train", f"data.val={corpus}/val", f"data.test={corpus}/test",
         f"data.cache_dir={corpus}/cache", "data.vocab_size=60", "data.max_tokens=512", "data.num_proc=1",
         "trainer.precision=32-true", "trainer.max_steps=2", "trainer.max_time=null", "trainer.log_every_n_steps=1",
         "trainer.val_check_interval=1",
         "trainer.enable_progress_bar=false", "train.val_bleu_max_sentences=2", "run_test=false",
         "attention_maps.every_n_validations=0", f"hydra.run.dir={run_dir}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert checkpoint["data_config"]["pairs"] == PAIRS
    log = (run_dir / "train.log").read_text()
    assert "en-de, en-fr, en-cs pairs after filtering" in log, log[-2000:]
    events = read_events(run_dir / "tensorboard")
    tags = set(events.Tags()["scalars"])
    assert {"val/bleu/en-de", "val/bleu/en-fr", "val/bleu/en-cs", "val/bleu"} <= tags, sorted(tags)
    per_pair = [[e.value for e in events.Scalars(f"val/bleu/{pair}")] for pair in PAIRS]
    means = [e.value for e in events.Scalars("val/bleu")]
    assert len(means) >= 1 and all(len(values) == len(means) for values in per_pair)
    for mean, *values in zip(means, *per_pair):
        assert mean == pytest.approx(sum(values) / 3, abs=1e-4)


def test_a_tagged_models_ctranslate2_export_decodes_equal_to_ours(tmp_path, monkeypatch, toy_model,
                                                                  tmp_path_factory):
    """The export records the model's pairs, so engine=ctranslate2 tags the source by the same rule (and, style
    decoder, passes the target tag as CTranslate2's target_prefix): greedy outputs equal ours line for line."""
    pytest.importorskip("ctranslate2")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ckpt, corpus = toy_model
    decoder_root = tmp_path_factory.mktemp("decoder_ct2")
    train_toy_model(write_toy_languages(decoder_root / "toy"), decoder_root / "toy.ckpt", steps=60,
                    lang_tags="decoder")
    lines = (corpus / "test.en").read_text().splitlines()
    for path in (ckpt, decoder_root / "toy.ckpt"):
        for tgt in ("de", "fr", "cs"):
            native = translate(tmp_path, path, f"tgt_lang={tgt}", "beam=1", lines=lines)
            ct2 = translate(tmp_path, path, f"tgt_lang={tgt}", "beam=1", "engine=ctranslate2", lines=lines)
            assert ct2 == native and any(native), (path, tgt)
    with pytest.raises(SystemExit, match="not trained on en-it"):
        translate(tmp_path, ckpt, "tgt_lang=it", "engine=ctranslate2", lines=["abc"])


# The smoke experiment's data (Multi30k, a 1000-piece vocabulary, 2048-token batches) as main's code at bea1912,
# before data.pairs existed, dealt it: the SHA-256 of every batch's src, tgt and index tensors (bytes and shapes)
# of the first training epoch, validation and test, in order (361, 14 and 13 batches). Measured 2026-12-04 by
# running the same loop on a checkout of bea1912; integer ids only, so no CPU arithmetic enters it. (The cache
# entries' names may change when what a key records changes; the batches may not.)
MAIN_SMOKE_BATCHES = {"train": 361, "val": 14, "test": 13,
                      "sha256": "c4a54867a09c0a4cb20406e631f5876cd500c8816e28a16d3e393cc151d10e06"}


def test_a_one_pair_runs_batches_are_mains(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the smoke experiment's relative data paths
    config = DataConfig(train="data/multi30k/train", val="data/multi30k/val", test="data/multi30k/test_2016_flickr",
                        cache_dir=str(tmp_path / "cache"), vocab_size=1000, max_tokens=2048, num_proc=1)
    dm = TranslationDataModule(config)
    dm.setup()
    digest, counts = hashlib.sha256(), {}
    for split, loader in (("train", dm.train_dataloader()), ("val", dm.dataloader("val")),
                          ("test", dm.dataloader("test"))):
        counts[split] = 0
        for batch in loader:
            for key in ("src", "tgt", "index"):
                digest.update(key.encode())
                digest.update(batch[key].numpy().tobytes())
                digest.update(str(tuple(batch[key].shape)).encode())
            counts[split] += 1
    assert {**counts, "sha256": digest.hexdigest()} == MAIN_SMOKE_BATCHES
    assert dm.splits["train"].pair_of is None and dm.pair_indices("val") is None


def test_a_multilingual_epoch_resumes_mid_way_in_a_new_process_and_the_fingerprint_reads_every_pair(tmp_path):
    """A datamodule built anew (as a resumed run builds it) deals the same temperature-sampled epochs, and a loader
    restored from the state after three batches yields the rest of the epoch and the next one as an uninterrupted
    run does; each epoch draws the subsampled pair's members anew; the training files' digest covers each pair's
    files: a line appended to the Czech side makes another run."""
    from omegaconf import OmegaConf

    from transformer_nmt.training.fingerprint import _split_digest

    corpus = write_toy_languages(tmp_path / "toy", n_train=200, sizes={"en-de": 200, "en-fr": 120, "en-cs": 40})
    locations = {split: str(corpus / "{pair}" / split) for split in ("train", "val", "test")}
    config = toy_config(corpus, pair_temperature=3.0, max_tokens=256, **locations)
    reference = TranslationDataModule(config)
    reference.setup()
    loader = reference.train_dataloader()
    loader.batch_sampler.set_epoch(1)
    full = [b["index"].tolist() for b in loader]
    following = [b["index"].tolist() for b in loader]  # the loader goes on to epoch 2 by itself
    again = TranslationDataModule(config)
    again.setup()
    np.testing.assert_array_equal(again.splits["train"].keep, reference.splits["train"].keep)
    loader = again.train_dataloader()
    loader.batch_sampler.set_epoch(1)
    it = iter(loader)
    first = [next(it)["index"].tolist() for _ in range(3)]
    resumed = again.train_dataloader()
    resumed.load_state_dict(loader.state_dict())
    resumed.batch_sampler.set_epoch(1)
    assert first + [b["index"].tolist() for b in resumed] == full and len(full) > 3
    assert [b["index"].tolist() for b in resumed] == following
    # T=3 takes fewer than the 200 en-de pairs per epoch: each epoch's are another subset, and what is dealt
    train, de = reference.splits["train"], 0
    members = {epoch: [i for batch in dealt for i in batch if train.pair_of[i] == de]
               for epoch, dealt in ((1, full), (2, following))}
    assert len(members[1]) == len(members[2]) == epoch_counts([200, 120, 40], 3.0)[de] < 200
    assert set(members[1]) != set(members[2])
    assert sorted(members[2]) == sorted(i for i in train.draw.members(2).tolist() if train.pair_of[i] == de)

    cfg = OmegaConf.create({"data": {**asdict(config)}})
    before = _split_digest(cfg)
    assert before is not None
    with open(corpus / "en-cs" / "train.cs", "a") as f_cs, open(corpus / "en-cs" / "train.en", "a") as f_en:
        f_cs.write("stu\n")
        f_en.write("abc\n")
    assert _split_digest(cfg) != before


def test_sampled_segmentations_keep_each_pairs_tag_in_front(tmp_path):
    """data.spm_alpha with data.pairs: each epoch's sampled source ids start with their pair's tag, never sampled."""
    corpus = write_toy_languages(tmp_path / "toy", n_train=60)
    dm = TranslationDataModule(toy_config(corpus, spm_alpha=0.3, seed=1))
    dm.setup()
    tags = [dm.tokenizer.piece_id(f"<2{pair.split('-')[1]}>") for pair in PAIRS]
    train = dm.splits["train"]
    for batch in dm.train_dataloader():
        expected = torch.tensor([tags[p] for p in train.pair_of[batch["index"].tolist()]])
        assert torch.equal(batch["src"][:, 0], expected)
        assert not any(t in row for row in batch["src"][:, 1:].tolist() for t in tags)


def test_an_ensemble_of_models_of_other_pairs_is_refused(tmp_path, toy_model):
    """checkpoint.translation_languages holds data.pairs and data.lang_tags: models over other directions, or tagged
    otherwise, are no ensemble (nor an average); a one-pair model's languages read as before."""
    from transformer_nmt.checkpoint import CKPT_DATA_CONFIG, translation_languages

    ckpt, _ = toy_model
    other = tmp_path / "other.ckpt"
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint[CKPT_DATA_CONFIG] = {**checkpoint[CKPT_DATA_CONFIG], "pairs": ["en-de", "en-fr"]}
    torch.save(checkpoint, other)
    with pytest.raises(SystemExit, match="ensemble: checkpoint .* translates .*data.pairs=.'en-de', 'en-fr'."):
        translate(tmp_path, f"[{ckpt},{other}]", "tgt_lang=fr", lines=["abc"])
    assert translate(tmp_path, f"[{ckpt},{ckpt}]", "tgt_lang=fr", lines=["abc"])
    assert translation_languages({"src_lang": "en", "tgt_lang": "de"}) == (("src_lang", "en"), ("tgt_lang", "de"))


def test_explore_and_analyze_heads_take_the_direction_as_translate_does(tmp_path, toy_model, capsys):
    """explore and analyze_heads choose the direction through inference/directions.py: tgt_lang=fr reads the source
    with <2fr> and writes French; a direction the model does not know is refused naming those it knows; analyze_heads
    scores the direction's part of the split, its loss that of the tagged ids training read."""
    from transformer_nmt.analysis.explore import main as explore_main
    from transformer_nmt.analysis.heads import main as heads_main
    from transformer_nmt.analysis.heads import reference_loss
    from transformer_nmt.checkpoint import load_checkpoint

    ckpt, corpus = toy_model
    sentence = (corpus / "test.en").read_text().splitlines()[0]
    capsys.readouterr()
    explore_main([f"ckpt={ckpt}", "tgt_lang=fr", f"output={tmp_path / 'page.html'}", sentence])
    translation = capsys.readouterr().out.splitlines()[0].split("\t")[1]
    assert letters_of(translation) and set(letters_of(translation)) <= set(ALPHABETS["fr"]), translation
    page = (tmp_path / "page.html").read_text()
    assert '"\\u003c2fr>"' in page  # the source's pieces, the tag first (the page escapes "<" in its data)
    for wrong, message in (("tgt_lang=it", "it knows en-de, en-fr, en-cs"), (None, "give tgt_lang=")):
        with pytest.raises(SystemExit, match=message):
            explore_main([f"ckpt={ckpt}", *([wrong] if wrong else []), f"output={tmp_path / 'x.html'}", sentence])
        with pytest.raises(SystemExit, match=message):
            heads_main([f"ckpt={ckpt}", *([wrong] if wrong else []), "split=val", f"out={tmp_path / 'x'}"])
    result = heads_main([f"ckpt={ckpt}", "tgt_lang=cs", "split=val", "max_sentences=6", "steps=1",
                         "trust_data_paths=true", f"out={tmp_path / 'heads'}"])
    model, tokenizer, _ = load_checkpoint(ckpt)
    sources, references = ((corpus / f"val.{lang}").read_text().splitlines()[:6] for lang in ("en", "cs"))
    cs = LanguageTags.of(torch.load(ckpt, weights_only=True)["data_config"]).direction("en", "cs")
    assert result["base"]["loss"] == pytest.approx(reference_loss(model, tokenizer, sources, references, 1024, cs),
                                                   rel=1e-5)  # the Czech part of the split, read with <2cs>
    untagged = reference_loss(model, tokenizer, sources, references, 1024)
    assert result["base"]["loss"] < 0.75 * untagged, (result["base"], untagged)  # the ids training read: likelier


def test_attention_maps_per_pair_are_told_apart_and_read_with_each_pairs_tag(tmp_path, toy_model):
    """attention_maps.per_pair: one group of maps per pair under attention/PAIR/..., each probe of the pair's
    validation part read with its tag (<2fr> first for en-fr); without it, one group under attention/..., its probes
    read with their own pair's tag."""
    from types import SimpleNamespace

    from torch.utils.tensorboard import SummaryWriter

    from transformer_nmt.checkpoint import load_checkpoint
    from transformer_nmt.training.callbacks import AttentionMaps

    ckpt, corpus = toy_model
    model, tokenizer, meta = load_checkpoint(ckpt)
    dm = TranslationDataModule(DataConfig(**{**meta["data_config"], "cache_dir": str(tmp_path / "cache")}))
    dm.setup()
    writer = SummaryWriter(str(tmp_path / "tb"))
    trainer = SimpleNamespace(datamodule=dm, sanity_checking=False, is_global_zero=True, global_step=5,
                              logger=SimpleNamespace(experiment=writer))
    module = SimpleNamespace(model=model, tokenizer=tokenizer, training=False, eval=lambda: None,
                             train=lambda mode=True: None)
    callback = AttentionMaps(n_probes=1, per_pair=True, inches=2.0, dpi=20)
    groups = callback._probe_groups(trainer)
    assert list(groups) == PAIRS
    for pair, probes in groups.items():
        keys = callback.attention_weights(model, tokenizer, probes)["encoder"][0][1]
        assert keys[0] == f"<2{pair.split('-')[1]}>", (pair, keys)
    callback.on_validation_end(trainer, module)
    callback.wait()
    writer.close()
    images = read_events(tmp_path / "tb").Tags()["tensors"]
    for pair in PAIRS:
        assert f"attention/{pair}/cross/layer_0/head_0" in images and f"attention/{pair}/encoder-self/layer_1/head_1" \
            in images
    assert not any(tag.startswith("attention/cross/") for tag in images)
    one = AttentionMaps(n_probes=2)._probe_groups(trainer)
    assert list(one) == [None] and [d.name for _, _, d in one[None]] == ["en-de", "en-de"]
