"""studies/multilingual.py on the toy languages at a toy budget: three bilingual runs, a one-to-many run with as
many updates as the three together, a many-to-many run; every pair scored, the zero-shot directions scored direct and
pivoted through English, and a second launch redoes nothing."""

import json
import os
import shutil
from pathlib import Path

import pytest
from study_scripts import load_study, train_steps_in_process
from toy_languages import write_toy_languages

from transformer_nmt.checkpoint import read_checkpoint


def quoted(overrides: list[str]) -> str:
    return "[" + ",".join(f"'{o}'" for o in overrides) + "]"


def test_the_study_trains_scores_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the runs record their data paths relative: evaluate reads them from here
    corpus = write_toy_languages(Path("toy"), n_train=40, n_eval=4)
    overrides = ["model=tiny", f"data.train={corpus}/train", f"data.val={corpus}/val", f"data.test={corpus}/test",
                 "data.cache_dir=cache", "data.vocab_size=60", "data.max_tokens=512", "data.num_proc=1",
                 "trainer.precision=32-true", "trainer.enable_progress_bar=false", "trainer.limit_val_batches=0",
                 "validate_at_end=false", "run_test=false", "attention_maps.every_n_validations=0"]
    argv = ["experiment=smoke", f"overrides={quoted(overrides)}", "seeds=[1]", "steps=1", f"test={corpus}/test",
            "beam=1", "splits=[test]", "out=study.json", "work=work"]
    study = load_study("multilingual")
    trained = train_steps_in_process(monkeypatch, study)
    result = study.main(argv)
    assert len(trained) == 5
    runs = {run["model"]: run for run in result["runs"]}
    assert list(runs) == ["bilingual en-de", "bilingual en-fr", "bilingual en-cs", "one-to-many", "many-to-many"]
    assert [runs[m]["updates"] for m in runs] == [1, 1, 1, 3, 4]  # the same total budget: 3 x 1 updates
    for name, run in runs.items():
        checkpoint = read_checkpoint(Path(run["run_dir"]) / "checkpoints" / "last.ckpt")
        assert checkpoint["global_step"] == run["updates"]
        assert checkpoint["data_config"]["pairs"] == (None if name.startswith("bilingual") else run["pairs"])
        for pair in run["pairs"]:
            assert run["scores"][pair]["test"]["sentences"] == 4, (name, pair)
    assert runs["many-to-many"]["pairs"] == ["en-de", "en-fr", "de-en", "fr-en"]
    zero = runs["many-to-many"]["zero_shot"]
    assert set(zero) == {"de-fr", "fr-de"} and all(set(row) == {"direct", "pivot"} for row in zero.values())
    direct = json.loads(Path("work/eval/many-to-many/seed1/de-fr.direct.json").read_text())
    assert direct["direction"] == {"src_lang": "de", "tgt_lang": "fr", "zero_shot": True}
    assert len(Path("work/eval/many-to-many/seed1/de-fr.pivot.en").read_text().splitlines()) == 4
    # the one-to-many model scored each pair on that pair's references
    refs = {pair: Path(f"work/eval/one-to-many/seed1/test.{pair}.ref").read_text().splitlines()
            for pair in runs["one-to-many"]["pairs"]}
    assert all(refs[f"en-{t}"] == (corpus / f"test.{t}").read_text().splitlines() for t in ("de", "fr", "cs"))
    capsys.readouterr()
    again = study.main(argv)  # again: every run and every evaluation found done, nothing decoded
    out = capsys.readouterr().out
    assert out.count("done already") == 5 + 14  # 5 runs; 3 + 3 + 4 pairs on test, 2 zero-shot x (direct, pivot)
    assert [run["scores"] for run in again["runs"]] == [run["scores"] for run in result["runs"]]
    assert again["runs"][-1]["zero_shot"] == zero
    assert again["seconds"] == result["seconds"] and all(s > 0 for s in again["seconds"].values())  # results.json's
    # a checkpoint newer than its evaluation is scored again; a beam other than the records' scores everything again
    ckpt = Path(runs["bilingual en-de"]["run_dir"]) / "checkpoints" / "last.ckpt"
    os.utime(ckpt, (ckpt.stat().st_atime, ckpt.stat().st_mtime + 60))
    study.main(argv)
    assert capsys.readouterr().out.count("done already") == 5 + 13
    study.main([a.replace("beam=1", "beam=2") for a in argv])
    out = capsys.readouterr().out
    assert out.count("done already") == 5
    assert "its 5 recorded runs are not kept: these options differ from this launch's: beam" in out
    study.main(argv)  # beam 1 again: the records are beam 2's now
    assert capsys.readouterr().out.count("done already") == 5
    # a second seed for the bilingual comparison alone: the many-to-many model keeps its one seed
    more = study.main([a.replace("seeds=[1]", "seeds=[1,2]") for a in argv] + ["many_to_many_seeds=[1]"])
    assert len(trained) == 5 + 4
    assert [(run["model"], run["seed"]) for run in more["runs"]] == [
        ("bilingual en-de", 1), ("bilingual en-de", 2), ("bilingual en-fr", 1), ("bilingual en-fr", 2),
        ("bilingual en-cs", 1), ("bilingual en-cs", 2), ("one-to-many", 1), ("one-to-many", 2), ("many-to-many", 1)]
    assert more["runs"][-1]["scores"] == result["runs"][-1]["scores"]  # the first seed's runs: found, not redone
    # models= limits a launch; the runs that out records and this launch does not make are kept from it, even where
    # their directories are gone (the committed file is their record)
    shutil.rmtree("work/runs/bilingual_en-cs")
    shutil.rmtree("work/eval/bilingual_en-cs")
    m2m = study.main([a.replace("seeds=[1]", "seeds=[2]") for a in argv]
                     + ["models=[many-to-many]", "many_to_many_seeds=[2]"])
    assert len(trained) == 5 + 4 + 1  # the many-to-many model's second seed alone
    assert [(run["model"], run["seed"]) for run in m2m["runs"]] == [
        (run["model"], run["seed"]) for run in more["runs"]] + [("many-to-many", 2)]
    assert m2m["runs"][:-1] == more["runs"]  # scores, zero-shot and "made" as recorded
    assert m2m["runs"][-1]["made"]["time_utc"] == m2m["provenance"]["time_utc"] != more["runs"][0]["made"]["time_utc"]
    assert set(m2m["runs"][-1]["zero_shot"]) == {"de-fr", "fr-de"}
    results = json.loads((Path(m2m["runs"][-1]["run_dir"]) / "results.json").read_text())
    assert m2m["runs"][-1]["trained"] == {"commit": results["provenance"]["git"]["commit"],
                                          "torch_threads": results["torch_threads"]}
    assert list(m2m["seconds"]) == [f"{model}, seed {seed}" for model, seed in
                                    [(run["model"], run["seed"]) for run in m2m["runs"]]]
    scores = [run["scores"]["en-de"]["test"]["bleu"] for run in m2m["runs"] if run["model"] == "many-to-many"]
    assert m2m["mean_bleu"]["many-to-many"]["en-de"]["test"] == round(sum(scores) / 2, 2)
    with pytest.raises(SystemExit, match="no model named 'bilingual en-xx'; the study's models: bilingual en-de, "):
        study.main(argv + ["models=['bilingual en-xx']"])
    with pytest.raises(SystemExit, match="models=many-to-many: give a list"):
        study.main(argv + ["models=many-to-many"])
    recorded = Path("study.json").read_text()
    with pytest.raises(SystemExit, match=r"its 10 recorded runs were made with other beam; a launch of models="):
        study.main([a.replace("beam=1", "beam=2") for a in argv] + ["models=[many-to-many]"])
    assert Path("study.json").read_text() == recorded and len(trained) == 5 + 4 + 1  # nothing dropped, nothing run
