"""studies/lowercased_text.py: the corpus in its lc.norm.tok form (Moses-normalized, Moses-tokenized, lowercased),
one line out per line in, and the recipe launched on it through reproduce with that corpus as train, val and test
(the reproduce pipeline itself is tests/test_reproduce_script.py's)."""

import json
from pathlib import Path

import pytest
from study_scripts import load_study
from tiny_corpus import write_tiny_corpus

pytest.importorskip("sacremoses")


def study_module():
    return load_study("lowercased_text")


def test_lines_take_the_lc_norm_tok_form():
    lines = ["A man sleeping in a green room on a couch.", "Two dogs, one \u201cwhite\u201d, can't run."]
    assert study_module().lowercased_tokenized(lines, "en") == [  # Moses puts English commas inside quotes
        "a man sleeping in a green room on a couch .", "two dogs , one \" white , \" can 't run ."]
    assert study_module().lowercased_tokenized(["Ein Mann schläft in einem grünen Raum auf einem Sofa."], "de") == [
        "ein mann schläft in einem grünen raum auf einem sofa ."]


def test_the_recipe_is_launched_on_the_lowercased_corpus_and_its_files_copied(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = write_tiny_corpus(Path("raw"), n_train=30, n_eval=6)
    study = study_module()
    launched = []

    def reproduce(name, done, command):  # stands in for run_step's python -m transformer_nmt.reproduce
        launched.append(command)
        done.parent.mkdir(parents=True, exist_ok=True)
        (done.parent / "results.json").write_text(json.dumps({"steps": 5}))
        done.write_text(json.dumps({"scores": {"test_beam5": {"bleu_multi30k": 12.5}}}))
        return 1.0

    monkeypatch.setattr(study, "run_step", reproduce)
    argv = [f"data={data}", "splits=[train,val,test]", "experiment=smoke", "run_id=lc", "out=docs/lc",
            "overrides=['trainer.max_steps=5']", "work=work"]
    record = study.main(argv)
    corpus = Path("work/corpus")
    for split, n in (("train", 30), ("val", 6), ("test", 6)):
        for lang in ("en", "de"):
            raw = (data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            lowered = (corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            assert len(lowered) == len(raw) == n
            assert lowered == [line.lower() for line in lowered] and lowered != raw
            assert record["files"][f"{split}.{lang}"]["lines"] == n
    assert launched == [["transformer_nmt.reproduce", "experiment=smoke", "run_dir=work/lc", "run_id=lc",
                         "data.src_lang=en", "data.tgt_lang=de", "data.train=work/corpus/train",
                         "data.val=work/corpus/val", "data.test=work/corpus/test", "trainer.max_steps=5"]]
    assert json.loads(Path("docs/lc_reproduce.json").read_text())["scores"]["test_beam5"]["bleu_multi30k"] == 12.5
    assert json.loads(Path("docs/lc_results.json").read_text()) == {"steps": 5}
    assert json.loads(Path("docs/lc_corpus.json").read_text())["files"] == record["files"]
    assert "test_beam5: BLEU 12.5 in the Multi30k convention" in capsys.readouterr().out
