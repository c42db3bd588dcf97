"""What a checkpoint records never chooses a path: ``evaluate split=val|test`` reads the data locations a checkpoint
records only when they are relative paths inside the directory evaluate runs in and the checkpoint lies there too
(or with ``trust_data_paths=true``),
language codes are validated wherever they become file names, and evaluate's outputs are written atomically,
replacing a symbolic link planted in ``eval/`` instead of writing through it."""

import dataclasses
import re

import pytest
import torch
from conftest import KEPT
from tiny_checkpoint import tiny_tokenizer, write_checkpoint
from tiny_corpus import write_tiny_corpus

from transformer_nmt.checkpoint import CKPT_DATA_CONFIG, atomic_torch_save
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.corpus import CorpusError, CorpusSpec
from transformer_nmt.inference.evaluate import main as evaluate_main

FAST = ["beam=1", "max_len_offset=5"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(vocab_size=100)


@pytest.fixture
def corpus(tmp_path):
    return write_tiny_corpus(tmp_path / "corpus", n_train=4, n_eval=3)


def checkpoint_recording(path, tokenizer, **data):
    """A checkpoint whose data config records ``data`` (over a valid one)."""
    write_checkpoint(path, tokenizer)
    checkpoint = torch.load(path, weights_only=True)
    options = dataclasses.asdict(DataConfig(train="corpus/train", val="corpus/val", test="corpus/test"))
    checkpoint[CKPT_DATA_CONFIG] = {**options, **data}
    atomic_torch_save(checkpoint, path)
    return path


@pytest.mark.parametrize("recorded", ["absolute", "dotdot"])
def test_a_recorded_path_outside_the_launch_dir_is_shown_not_read(tmp_path, tokenizer, corpus, victim, monkeypatch,
                                                                  recorded):
    """The checkpoint records a test prefix outside the directory evaluate runs in: refused with the recorded path
    and what to pass; nothing is read, nothing written. The user's trust_data_paths=true reads it."""
    (victim.parent / "victim.txt.en").write_text("A private line.\n")  # what PREFIX.{src_lang} would read
    (victim.parent / "victim.txt.de").write_text(KEPT)
    prefix = str(victim) if recorded == "absolute" else "../home/victim.txt"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    ckpt = checkpoint_recording(tmp_path / "shared" / "model.ckpt", tokenizer, test=prefix)
    with pytest.raises(SystemExit, match=rf"checkpoint {ckpt} records data.test='{prefix}'.*outside .*{work}.*"
                                         r"src=FILE ref=FILE.*trust_data_paths=true"):
        evaluate_main([f"ckpt={ckpt}", "split=test", *FAST])
    assert not (ckpt.parent / "eval").exists() and sorted(p.name for p in work.iterdir()) == []
    result = evaluate_main([f"ckpt={ckpt}", "split=test", "trust_data_paths=true", *FAST])
    assert result["sentences"] == 1 and victim.read_text() == KEPT


def test_relative_recorded_paths_inside_the_launch_dir_are_read(tmp_path, tokenizer, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)  # corpus/ is here: the recorded prefixes are the user's own data
    ckpt = checkpoint_recording(tmp_path / "run" / "model.ckpt", tokenizer)
    assert evaluate_main([f"ckpt={ckpt}", "split=val", *FAST])["sentences"] == 3


@pytest.mark.parametrize("recorded", [{"format": "tsv", "test": "private/secrets.tsv"}, {"test": "corpus/test"},
                                      {"format": "hub", "hub_name": "someorg/somedataset"}],
                         ids=["a tsv of the user's", "the user's corpus", "a hub name"])
def test_a_checkpoint_from_elsewhere_never_picks_a_file_in_the_launch_dir(tmp_path, tokenizer, corpus, monkeypatch,
                                                                          recorded):
    """A stranger's checkpoint (outside the launch dir) recording a relative path that names a file of the user's
    under the launch dir (private/secrets.tsv), or a relative Hub name (a download): refused, naming the recorded
    value, the checkpoint and the ways forward; nothing read, nothing written, the network never tried. The same
    file recorded by a checkpoint inside the launch dir (one's own run) is read."""
    work = tmp_path / "work"
    (work / "private").mkdir(parents=True)
    (work / "private" / "secrets.tsv").write_text("A password.\thunter2\nA key.\tswordfish\nA pin.\t1234\n")
    (work / "corpus").symlink_to(corpus, target_is_directory=True)  # the user's data, under the launch dir
    monkeypatch.chdir(work)
    ckpt = checkpoint_recording(tmp_path / "shared" / "s10" / "model.ckpt", tokenizer, **recorded)
    key, value = ("data.hub_name", recorded["hub_name"]) if "hub_name" in recorded else ("data.test", recorded["test"])
    with pytest.raises(SystemExit, match=rf"checkpoint {ckpt} records {key}='{value}', .*and lies outside the "
                                         rf"directory evaluate runs in \({work}\).*src=FILE ref=FILE.*"
                                         r"trust_data_paths=true"):
        evaluate_main([f"ckpt={ckpt}", "split=test", *FAST])
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["model.ckpt"]  # no eval/
    if "hub_name" not in recorded:  # one's own run: the same record, read
        own = checkpoint_recording(work / "outputs" / "run" / "model.ckpt", tokenizer, **recorded)
        assert evaluate_main([f"ckpt={own}", "split=test", *FAST])["sentences"] == 3


def test_an_absolute_hub_directory_is_refused_too(tmp_path, tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoint_recording(tmp_path / "model.ckpt", tokenizer, format="hub", hub_name="/srv/private/dataset",
                                test="test")
    with pytest.raises(SystemExit, match=r"records data.hub_name='/srv/private/dataset'"):
        evaluate_main([f"ckpt={ckpt}", "split=test", *FAST])


@pytest.mark.parametrize("option, value", [("tgt_lang", "/id_rsa"), ("src_lang", "en/../../x"), ("tgt_lang", ""),
                                           ("src_lang", "a" * 17), ("tgt_lang", "de\n")])
def test_language_codes_are_validated_where_they_become_file_names(tmp_path, tokenizer, corpus, monkeypatch, option,
                                                                   value):
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoint_recording(tmp_path / "model.ckpt", tokenizer, **{option: value})
    with pytest.raises(SystemExit, match=rf"checkpoint {ckpt}: data.{option}={re.escape(repr(value)[:20])}.* is not a "
                                         r"language code"):
        evaluate_main([f"ckpt={ckpt}", "split=test", "trust_data_paths=true", *FAST])
    assert not (tmp_path / "eval").exists()
    with pytest.raises(CorpusError, match=rf"data.{option}="):  # the training side builds the same spec
        spec = {"src_lang": "en", "tgt_lang": "de", option: value}
        CorpusSpec("text", (spec["src_lang"], spec["tgt_lang"]), {"test": "corpus/test"})


def test_language_codes_in_use_pass(tmp_path):
    for langs in (("en", "de"), ("pt_BR", "zh-Hant"), ("x" * 16, "y")):
        CorpusSpec("text", langs, {"test": "corpus/test"})


def test_outputs_replace_a_planted_symlink_and_never_write_through_it(tmp_path, tokenizer, corpus, victim,
                                                                     monkeypatch):
    """eval/test.ref planted as a link to the victim: the evaluation replaces the link (os.replace renames over the
    link itself), the victim keeps its contents; no temporary file stays behind."""
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoint_recording(tmp_path / "run" / "model.ckpt", tokenizer)
    eval_dir = ckpt.parent / "eval"
    eval_dir.mkdir()
    for suffix in ("hyp", "ref", "json"):
        (eval_dir / f"test.{suffix}").symlink_to(victim)
    evaluate_main([f"ckpt={ckpt}", "split=test", *FAST])
    assert victim.read_text() == KEPT
    for suffix in ("hyp", "ref", "json"):
        assert not (eval_dir / f"test.{suffix}").is_symlink() and (eval_dir / f"test.{suffix}").is_file()
    assert (eval_dir / "test.ref").read_text() == (corpus / "test.de").read_text()
    assert sorted(p.name for p in eval_dir.iterdir()) == ["test.hyp", "test.json", "test.ref"]


def test_a_default_eval_dir_that_is_a_symlink_is_refused(tmp_path, tokenizer, corpus, victim, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoint_recording(tmp_path / "run" / "model.ckpt", tokenizer)
    (ckpt.parent / "eval").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(SystemExit, match=rf"{ckpt.parent / 'eval'} is a symbolic link .*out=DIR"):
        evaluate_main([f"ckpt={ckpt}", "split=test", *FAST])
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]
    out = tmp_path / "mine"  # a directory the user names is the user's
    evaluate_main([f"ckpt={ckpt}", "split=test", f"out={out}", *FAST])
    assert (out / "test.json").is_file()
