"""studies/best_model.py's plan, with reproduce, synthesize and evaluate stood in for (their own tests train and
score): the budget refused before anything runs; each teacher trained at the hour's updates with its seed; the
ensemble's length penalty chosen on val; the student trained on the ensemble's translations (alone, or after the
original pairs) with the teachers' vocabulary; the model val chooses is the only one with a test score; a second
launch redoes nothing."""

import json
import shutil
from pathlib import Path

import pytest
from study_scripts import load_study
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.training.app import train

TEACHER_VAL = {1234: 40.0, 2: 41.0}
ENSEMBLE_VAL = {0.6: 41.5, 1.0: 42.5, 1.4: 42.0}  # 1.0 is the best on val


def scores(bleu: float) -> dict:
    return {"bleu": bleu, "bleu_multi30k": bleu + 0.3, "chrf": 60.0, "length_ratio": 1.0}


class StandIns:
    """run_step and evaluate_once as the study calls them, recording each call and writing what the real step
    would: a reproduce run's report and chosen checkpoint, synthesize's corpus."""

    def __init__(self, teacher_ckpt: Path, student_val: float):
        self.teacher_ckpt, self.student_val = teacher_ckpt, student_val
        self.commands, self.evaluations, self.blind = [], [], []

    def run_step(self, name, done, command):
        if done.exists():
            return 0.0
        self.commands.append(command)
        args = dict(a.split("=", 1) for a in command[1:])
        if command[0] == "transformer_nmt.synthesize":
            source = Path(args["input"]).read_text(encoding="utf-8").splitlines()
            for lang, lines in (("en", source), ("de", [f"distilled {i}" for i in range(len(source))])):
                Path(f"{args['output']}.{lang}").parent.mkdir(parents=True, exist_ok=True)
                Path(f"{args['output']}.{lang}").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
            return 1.0
        assert command[0] == "transformer_nmt.reproduce"
        run = done.parent
        (run / "checkpoints").mkdir(parents=True)
        shutil.copyfile(self.teacher_ckpt, run / "checkpoints" / "last.ckpt")
        val = TEACHER_VAL[int(args["seed"])] if "teacher" in args["run_id"] else self.student_val
        report = {"chosen": "last.ckpt", "search": {"beam": 4, "length_penalty": "gnmt", "alpha": 1.4},
                  "scores": {"val_beam4": scores(val), "test_beam4": scores(val - 1.5)}}
        done.write_text(json.dumps(report))
        (run / "results.json").write_text(json.dumps({"run": run.name}))
        (run / "eval").mkdir()
        for split in ("val", "test"):
            (run / "eval" / f"{split}_last_beam4_gnmt1.4.hyp").write_text(f"{run.name} {split}\n")
        return 2.0

    def evaluate_once(self, ckpt, out, name, options):
        self.evaluations.append((ckpt, name, options))
        alpha = float(next(o for o in options if o.startswith("alpha=")).split("=")[1])
        return {**scores(ENSEMBLE_VAL[alpha] - (2.0 if "split=test" in options else 0.0)), "sentences": 8}

    def translate_blind(self, ckpt, search, blind, translations, tgt):
        self.blind.append((ckpt, search, translations))


@pytest.fixture
def teacher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = write_tiny_corpus(Path("corpus"), n_train=12, n_eval=4)
    train(tiny_config(corpus, "trainer.max_steps=1", "trainer.limit_val_batches=0", "validate_at_end=false"),
          tmp_path / "teacher")
    return tmp_path / "teacher" / "checkpoints" / "last.ckpt", corpus


def launch(monkeypatch, stand_ins, *argv):
    study = load_study("best_model")
    monkeypatch.setattr(study, "run_step", stand_ins.run_step)
    monkeypatch.setattr(study, "evaluate_once", stand_ins.evaluate_once)
    monkeypatch.setattr(study, "translate_blind", stand_ins.translate_blind)
    return study.main(["runs=runs", "work=work", "out=out", *argv])


def test_the_student_learns_from_the_ensemble_chosen_on_val_and_only_the_chosen_model_has_a_test_score(
        teacher, monkeypatch):
    ckpt, corpus = teacher
    stand_ins = StandIns(ckpt, student_val=43.0)
    result = launch(monkeypatch, stand_ins, "student_corpus=both", "student_updates=100", "hour_updates=50")

    reproduce = [dict(a.split("=", 1) for a in c[1:]) for c in stand_ins.commands if c[0].endswith("reproduce")]
    assert [(r["run_id"], r["seed"], r["trainer.max_steps"]) for r in reproduce] == [
        ("best_teacher_1234", "1234", "50"), ("best_teacher_2", "2", "50"), ("best_student_both_7", "7", "100")]
    assert all(r["trainer.max_time"] == "null" for r in reproduce)
    teachers = [str(Path("runs") / f"best_teacher_{s}" / "checkpoints" / "last.ckpt") for s in (1234, 2)]
    assert [e[1] for e in stand_ins.evaluations[:3]] == [f"val_ensemble_beam4_gnmt{a:g}" for a in ENSEMBLE_VAL]
    assert all(e[0] == f"[{','.join(teachers)}]" for e in stand_ins.evaluations)

    (synthesize,) = [dict(a.split("=", 1) for a in c[1:]) for c in stand_ins.commands if c[0].endswith("synthesize")]
    assert synthesize["ckpt"] == f"[{','.join(teachers)}]" and synthesize["alpha"] == "1.0"  # val's choice
    assert synthesize["input"] == str(corpus / "train.en")

    both = Path("work/both/train")
    originals = {lang: (corpus / f"train.{lang}").read_text().splitlines() for lang in ("en", "de")}
    assert Path(f"{both}.en").read_text().splitlines() == originals["en"] * 2  # the sources, twice
    assert Path(f"{both}.de").read_text().splitlines() == originals["de"] + [f"distilled {i}" for i in range(12)]
    assert reproduce[2]["data.train"] == str(both)
    assert Path(reproduce[2]["data.tokenizer_path"]).read_bytes()  # the teachers' SentencePiece model, written out

    steps = {s["step"]: s for s in result["steps"]}
    assert list(steps) == ["teacher, seed 1234", "teacher, seed 2", "ensemble of the 2 teachers",
                           "student on the both corpus"]
    assert steps["ensemble of the 2 teachers"]["val"]["bleu"] == 42.5
    assert result["chosen"] == "student on the both corpus"
    assert [name for name, s in steps.items() if "test" in s] == ["student on the both corpus"]
    assert steps["student on the both corpus"]["test"]["bleu"] == 41.5
    assert result["training_hours"] == 4.0  # (2 teachers x 50 + 100 student updates) / 50 an hour: the budget
    assert json.loads(Path("out/best_model.json").read_text())["chosen"] == result["chosen"]
    for run in ("best_teacher_1234", "best_teacher_2", "best_student_both_7"):  # each run kept as it ended
        assert json.loads(Path(f"out/{run}_results.json").read_text()) == {"run": run}
        assert Path(f"out/hyps/{run}/test.de").read_text() == f"{run} test\n"
    student = str(Path("runs/best_student_both_7/checkpoints/last.ckpt"))
    assert stand_ins.blind == [(student, {"beam": 4, "length_penalty": "gnmt", "alpha": 1.4},
                                Path("docs/quality/blind/best_model"))]  # the chosen model, once

    count = len(stand_ins.commands)
    launch(monkeypatch, stand_ins, "student_corpus=both", "student_updates=100", "hour_updates=50")
    assert len(stand_ins.commands) == count  # every step found done


def test_the_ensemble_when_val_chooses_it_is_scored_on_test_once(teacher, monkeypatch):
    ckpt, _ = teacher
    stand_ins = StandIns(ckpt, student_val=42.0)
    result = launch(monkeypatch, stand_ins, "student_updates=10", "hour_updates=50", "budget_hours=3")
    assert result["chosen"] == "ensemble of the 2 teachers"
    tests = [e for e in stand_ins.evaluations if "split=test" in e[2]]
    assert [e[1] for e in tests] == ["test_ensemble_beam4_gnmt1"]
    assert [s["step"] for s in result["steps"] if "test" in s] == ["ensemble of the 2 teachers"]
    teachers = ",".join(str(Path("runs") / f"best_teacher_{s}" / "checkpoints" / "last.ckpt") for s in (1234, 2))
    assert stand_ins.blind == [(f"[{teachers}]", {"beam": 4, "length_penalty": "gnmt", "alpha": 1.0},
                                Path("docs/quality/blind/best_model"))]
    student = next(c for c in stand_ins.commands if "run_id=best_student_distilled_7" in c)
    assert "data.train=work/distilled/train" in student  # distilled alone by default


@pytest.mark.parametrize("argv, message", [
    (["student_updates=20000"], "over budget_hours=4"),
    (["teachers=[1,1]"], "a seed twice"),
    (["teachers=[]"], "at least one seed"),
    (["student_corpus=original"], "student_corpus='original'"),
    (["alphas=[]"], "alphas="),
])
def test_a_plan_that_cannot_run_is_refused_before_any_step(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stand_ins = StandIns(tmp_path / "none.ckpt", student_val=0.0)
    with pytest.raises(SystemExit, match=message):
        launch(monkeypatch, stand_ins, *argv)
    assert stand_ins.commands == [] and not Path("runs").exists()
