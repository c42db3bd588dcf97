"""studies/ensemble_study.py decodes whole splits with recipe-sized models, so CI checks its logic with evaluate
replaced by a table of known scores: which checkpoints each row decodes (the newest k, the first k seeds), that the
averages it writes are the mean of those weights, that the choice is made on val and never on test, what its JSON
records, and the docs table scripts/docs_tables.py writes from that JSON."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from study_scripts import load_study
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint

SCRIPTS = Path(__file__).resolve().parents[1] / "studies"


def script(name: str):
    if name != "docs_tables":
        return load_study(name)  # as python studies/NAME.py runs it: its imports of studies/ resolve
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS.parent / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


# Known scores by what a row decodes (a file's stem, or "ens:" and the stems of an ensemble's files):
# on val the ensemble of the newest 2 is best, on test the average of 4; among seeds, val picks the ensemble of 2.
VAL = {"step40": 20.0, "average_last2": 21.0, "ens:step30,step40": 25.0, "average_last4": 22.0,
       "ens:step10,step20,step30,step40": 24.0,
       "last": 10.0, "averaged": 11.0, "ens:averaged,last": 14.0, "ens:averaged,last,last": 13.0}
TEST = {"step40": 21.0, "average_last2": 22.0, "ens:step30,step40": 26.0, "average_last4": 30.0,
        "ens:step10,step20,step30,step40": 27.0,
        "last": 12.0, "averaged": 13.0, "ens:averaged,last": 15.0, "ens:averaged,last,last": 16.0}


def row_key(ckpt: str) -> str:
    if ckpt.startswith("["):
        return "ens:" + ",".join(Path(p).stem for p in ckpt[1:-1].split(","))
    return Path(ckpt).stem


@pytest.fixture
def study(tmp_path, monkeypatch):
    """The script with evaluate replaced: it records each call's options and answers from VAL and TEST; run in
    ``tmp_path``, where its default work directory (outputs/ensemble_study/) goes."""
    monkeypatch.chdir(tmp_path)
    module = script("ensemble_study")
    calls = []

    def fake_evaluate(argv):
        options = dict(arg.split("=", 1) for arg in argv)
        calls.append(options)
        bleu = (VAL if options["split"] == "val" else TEST)[row_key(options["ckpt"])]
        models = options["ckpt"].count(",") + 1
        return {"bleu": bleu, "bleu_lowercase": bleu + 0.5, "bleu_multi30k": bleu + 0.25, "chrf": 50.0,
                "length_ratio": 0.95, "decode_seconds": 2.0 * models, "sentences": 7, "threads": 2}

    monkeypatch.setattr(module, "evaluate", fake_evaluate)
    return module, calls


def recent_run(tmp_path, tokenizer) -> tuple[Path, dict]:
    run = tmp_path / "run"
    models = {step: write_checkpoint(run / "checkpoints" / "recent" / f"step{step}.ckpt", tokenizer, seed=step,
                                     step=step, run="one")
              for step in (10, 20, 30, 40)}
    return run, models


def seed_runs(tmp_path, tokenizer) -> list[Path]:
    """Three runs: the first with an averaged.ckpt beside its last.ckpt (the average is its model), two with
    last.ckpt only; the first two record their seeds (7 and 8) in results.json, as training does."""
    runs = [tmp_path / "sweep" / str(i) for i in range(3)]
    for i, run in enumerate(runs):
        write_checkpoint(run / "checkpoints" / "last.ckpt", tokenizer, seed=10 + i)
    write_checkpoint(runs[0] / "averaged.ckpt", tokenizer, seed=20)
    for run, seed in zip(runs, (7, 8)):
        (run / "results.json").write_text(json.dumps({"seed": seed, "val_bleu": 1.0}), encoding="utf-8")
    return runs


def test_recent_rows_decode_the_newest_k_and_average_exactly_those(study, tmp_path, tokenizer):
    module, calls = study
    run, models = recent_run(tmp_path, tokenizer)
    out = tmp_path / "study.json"
    result = module.main([f"run={run}", "last=4", "sizes=[2,9]", "beam=3", f"out={out}"])
    rows = result["groups"]["recent checkpoints"]
    assert [r["name"] for r in rows] == ["newest alone", "average of 2", "ensemble of 2", "average of 4",
                                         "ensemble of 4"]
    recent = run / "checkpoints" / "recent"
    assert rows[2]["checkpoints"] == [str(recent / "step30.ckpt"), str(recent / "step40.ckpt")]
    assert rows[4]["checkpoints"] == [str(recent / f"step{s}.ckpt") for s in (10, 20, 30, 40)]
    assert rows[0]["checkpoints"] == [str(recent / "step40.ckpt")]
    assert [r["models"] for r in rows] == [1, 1, 2, 1, 4]
    assert len(calls) == 5 * 2 and all(c["beam"] == "3" for c in calls)
    assert [c["split"] for c in calls] == ["val", "test"] * 5
    averaged, _, _ = load_checkpoint(tmp_path / "outputs" / "ensemble_study" / "study" / "average_last2.ckpt")
    for name, value in averaged.state_dict().items():
        expected = (models[30].state_dict()[name] + models[40].state_dict()[name]) / 2
        torch.testing.assert_close(value, expected, atol=1e-6, rtol=0)
    assert rows[2]["test"] == {"bleu": 26.0, "bleu_lowercase": 26.5, "bleu_multi30k": 26.25, "chrf": 50.0,
                               "length_ratio": 0.95, "decode_seconds": 4.0, "sentences": 7, "threads": 2}
    # val chooses the ensemble of 2 (25.0), although on test the average of 4 scores higher (30.0 against 26.0)
    assert result["chosen"] == {"recent checkpoints": "ensemble of 2"} and result["chosen_on"] == "val"
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["groups"] == result["groups"] and written["chosen"] == result["chosen"]
    assert written["provenance"]["argv"][1:] == [f"run={run}", "last=4", "sizes=[2,9]", "beam=3", f"out={out}"]
    assert written["provenance"]["config"]["options"]["last"] == 4


def test_seed_rows_each_alone_then_the_first_k_together(study, tmp_path, tokenizer):
    module, calls = study
    runs = seed_runs(tmp_path, tokenizer)
    result = module.main([f"seeds=[{','.join(map(str, runs))}]", "sizes=[2]", "splits=[val]",
                          f"out={tmp_path / 'seeds.json'}", f"work={tmp_path / 'work'}"])
    rows = result["groups"]["seeded runs"]
    assert [r["name"] for r in rows] == ["seed 7 alone", "seed 8 alone", "2 alone", "ensemble of 2 seeds",
                                         "ensemble of 3 seeds"]
    models = [str(runs[0] / "averaged.ckpt"), str(runs[1] / "checkpoints" / "last.ckpt"),
              str(runs[2] / "checkpoints" / "last.ckpt")]
    assert [r["checkpoints"] for r in rows] == [[m] for m in models] + [models[:2], models]
    assert [c["split"] for c in calls] == ["val"] * 5
    assert result["chosen"] == {"seeded runs": "ensemble of 2 seeds"}


@pytest.mark.parametrize("args, message", [
    (["last=3"], "give run=RUN"),
    (["run=RUN", "seeds=[SEED0]"], r"two runs or more"),
    (["run=RUN", "sizes=[0]"], r"sizes=\[0\]: give whole numbers >= 2"),
    (["run=RUN", "splits=[]"], r"splits=\[\]: give at least one split"),
    (["run=RUN", "seeds=[SEED0,MISSING]"], r"seeds: .*missing has neither averaged.ckpt nor checkpoints/last.ckpt"),
    (["run=RUN", "seeds=[SEED0,SEED1,SEED0]"], r"seeds: .*0 and .*0 are both 'seed 7': give runs of different seeds"),
])
def test_bad_options_are_named_before_anything_is_decoded(study, tmp_path, tokenizer, args, message):
    module, calls = study
    run, _ = recent_run(tmp_path, tokenizer)
    seeds = seed_runs(tmp_path, tokenizer)
    paths = {"RUN": run, "SEED0": seeds[0], "SEED1": seeds[1], "MISSING": tmp_path / "missing"}
    for key in sorted(paths, key=len, reverse=True):
        args = [a.replace(key, str(paths[key])) for a in args]
    with pytest.raises(SystemExit, match=message):
        module.main([*args, f"out={tmp_path / 'x.json'}"])
    assert not calls and not (tmp_path / "x.json").exists()


def test_the_docs_table_marks_the_val_choice_and_its_gain_over_the_average(study, tmp_path, tokenizer):
    module, _ = study
    run, _ = recent_run(tmp_path, tokenizer)
    root = tmp_path / "root"
    (root / "docs" / "quality").mkdir(parents=True)
    module.main([f"run={run}", "last=4", "sizes=[2]", f"out={root / 'docs' / 'quality' / 'ens.json'}"])
    text = script("docs_tables").ensemble_study(root, "ens.json")
    lines = text.splitlines()
    assert lines[0].startswith("| model | models | val BLEU | val decode s | **test BLEU** |")
    assert "| **ensemble of 2** (chosen on val) | 2 | 25.00 | 4.0 | 26.00 | 26.50 | 26.25 | 0.950 | 4.0 |" in lines
    assert "| average of 4 | 1 | 22.00 | 2.0 | 30.00 | 30.50 | 30.25 | 0.950 | 2.0 |" in lines
    # against the recipe's own choice, the average of the most (4): test 26 - 30, val 25 - 22, seconds 4 / 2
    assert ("Recent checkpoints: chosen on val, ensemble of 2 gives 26.00 on test, -4.00 against average of 4 "
            "(30.00; on val +3.00), decoding in 2.0x its seconds.") in lines


def test_the_docs_table_weighs_seed_ensembles_against_the_mean_run_and_refuses_one_split(study, tmp_path, tokenizer):
    module, _ = study
    runs = seed_runs(tmp_path, tokenizer)
    root = tmp_path / "root"
    out = root / "docs" / "quality" / "seeds.json"
    module.main([f"seeds=[{','.join(map(str, runs))}]", "sizes=[2]", f"out={out}", f"work={tmp_path / 'work'}"])
    tables = script("docs_tables")
    lines = tables.ensemble_study(root, "seeds.json").splitlines()
    assert ("| **ensemble of 2 seeds** (chosen on val) | 2 | 14.00 | 4.0 | 15.00 | 15.50 | 15.25 | 0.950 | 4.0 |"
            in lines)
    # the runs alone: val 11, 10, 10 (mean 31/3), test 13, 12, 12 (mean 37/3), 2.0 s each
    assert ("Seeded runs: chosen on val, ensemble of 2 seeds gives 15.00 on test, +2.67 against the mean of the 3 "
            "runs alone (12.33; on val +3.67), decoding in 2.0x its seconds.") in lines
    assert lines[-1].startswith(f"`python studies/ensemble_study.py seeds=[{runs[0]},")
    assert "(beam 4, 2 threads;" in lines[-1]
    data = json.loads(out.read_text(encoding="utf-8"))
    data["options"]["splits"] = ["val"]
    out.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SystemExit, match="one split \\(val\\); the docs report a split the choice was not made on"):
        tables.ensemble_study(root, "seeds.json")


def test_the_docs_table_says_when_the_reference_itself_is_chosen(study, tmp_path, tokenizer, monkeypatch):
    module, _ = study
    run, _ = recent_run(tmp_path, tokenizer)
    monkeypatch.setitem(VAL, "average_last2", 40.0)
    root = tmp_path / "root"
    module.main([f"run={run}", "last=2", f"out={root / 'docs' / 'quality' / 'ens.json'}", f"work={tmp_path / 'w'}"])
    lines = script("docs_tables").ensemble_study(root, "ens.json").splitlines()
    assert "Recent checkpoints: chosen on val, average of 2 itself (22.00 on test)." in lines
