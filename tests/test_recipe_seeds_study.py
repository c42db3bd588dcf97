"""studies/recipe_seeds.py: a finished reproduce run's reports and chosen hypotheses kept byte for byte, and the
blind sources translated once with the chosen checkpoint and the chosen search, one line out per line in."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
from study_scripts import load_study

from transformer_nmt.inference.translate import main as translate

BLIND = ["A man rides a red bike.", "", "Two dogs play in the snow."]


def fake_run(root: Path, ckpt: Path, chosen: str) -> Path:
    """A run directory as reproduce leaves it: its checkpoint where ``chosen`` names it, the reports, the chosen
    model's val and test hypotheses (beam 2, GNMT alpha 1.4), and a decoy hypothesis of another search."""
    run = root / "seed_7"
    (run / "checkpoints").mkdir(parents=True)
    (run / "eval").mkdir()
    shutil.copyfile(ckpt, run / ("averaged.ckpt" if chosen == "averaged.ckpt" else "checkpoints/last.ckpt"))
    report = {"chosen": chosen, "search": {"beam": 2, "length_penalty": "gnmt", "alpha": 1.4},
              "scores": {"test_beam2": {"bleu": 1.0}}}
    (run / "reproduce.json").write_text(json.dumps(report))
    (run / "results.json").write_text(json.dumps({"steps": 9}))
    stem = Path(chosen).stem
    for split in ("val", "test"):
        (run / "eval" / f"{split}_{stem}_beam2_gnmt1.4.hyp").write_text(f"{split} chosen\n")
        (run / "eval" / f"{split}_{stem}_beam2_gnmt0.6.hyp").write_text(f"{split} decoy\n")
    return run


@pytest.mark.parametrize("chosen", ["last.ckpt", "averaged.ckpt"])
def test_reports_hypotheses_and_blind_translations_are_kept(tmp_path, trained_checkpoint_path, monkeypatch, chosen):
    study = load_study("recipe_seeds")
    run = fake_run(tmp_path / "runs", trained_checkpoint_path, chosen)
    blind = tmp_path / "blind"
    blind.mkdir()
    with gzip.open(blind / "test_2099_set.en.gz", "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in BLIND))
    calls = []
    monkeypatch.setattr(study, "translate", lambda argv: calls.append(argv) or translate(argv))
    out = tmp_path / "docs"
    study.main([f"runs=[{run}]", f"out={out}", f"blind={blind}", f"blind_out={out / 'blind'}"])

    assert (out / "seed_7_reproduce.json").read_bytes() == (run / "reproduce.json").read_bytes()
    assert json.loads((out / "seed_7_results.json").read_text()) == {"steps": 9}
    for split in ("val", "test"):  # the chosen search's file, not the decoy's
        assert (out / "hyps" / "seed_7" / f"{split}.de").read_text() == f"{split} chosen\n"
    ckpt = run / ("averaged.ckpt" if chosen == "averaged.ckpt" else "checkpoints/last.ckpt")
    assert len(calls) == 1
    assert {a.split("=", 1)[0]: a.split("=", 1)[1] for a in calls[0]} == {
        "ckpt": str(ckpt), "input": str(blind / "test_2099_set.en.gz"),
        "output": str(out / "blind" / "seed_7" / "test_2099_set.de.partial"), "beam": "2",
        "length_penalty": "gnmt", "alpha": "1.4"}
    lines = (out / "blind" / "seed_7" / "test_2099_set.de").read_text(encoding="utf-8").split("\n")
    assert len(lines) == len(BLIND) + 1 and lines[-1] == ""  # one line out per line in
    assert lines[1] == "" and lines[0] and lines[2]  # the blank line stays blank
    assert not list((out / "blind" / "seed_7").glob("*.partial"))

    # again: the translation is not redone
    study.main([f"runs=[{run}]", f"out={out}", f"blind={blind}", f"blind_out={out / 'blind'}"])
    assert len(calls) == 1


def test_a_run_without_reproduce_or_with_an_unknown_choice_is_refused(tmp_path, trained_checkpoint_path):
    study = load_study("recipe_seeds")
    with pytest.raises(SystemExit, match="no reproduce.json"):
        study.main([f"runs=[{tmp_path}]", f"out={tmp_path / 'docs'}"])
    run = fake_run(tmp_path / "runs", trained_checkpoint_path, "last.ckpt")
    report = json.loads((run / "reproduce.json").read_text())
    (run / "reproduce.json").write_text(json.dumps({**report, "chosen": "../../elsewhere.ckpt"}))
    with pytest.raises(SystemExit, match="neither of"):
        study.main([f"runs=[{run}]", f"out={tmp_path / 'docs'}"])
    with pytest.raises(SystemExit, match="name the reproduce run directories"):
        study.main([f"out={tmp_path / 'docs'}"])
