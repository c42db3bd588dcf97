"""studies/best_model.py's plan, with reproduce, synthesize, evaluate and the blind translations stood in for (their
own tests train, decode and score): the budget and the precision refused before anything runs; each teacher
trained at the hour's updates with its seed and no test score; the ensemble's length penalty chosen on val; the
student trained on the ensemble's translations (alone, or beside the original pairs) with the teachers'
vocabulary; the model val chooses is the only one scored on test; a second launch trains nothing, and a changed
plan over the same work directory is refused."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from study_scripts import STUDIES, load_study
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.hardware import CPU_BF16_ENV
from transformer_nmt.training.app import train

TEACHER_VAL = {1234: 40.0, 2: 41.0, 5: 39.0}
ENSEMBLE_VAL = {0.6: 41.5, 1.0: 42.5, 1.4: 42.0}  # 1.0 is the best on val
RUNS = Path("outputs/multi30k_cpu_en_de")  # where reproduce's runs of the recipe go (run_directory)


def scores(bleu: float) -> dict:
    return {"bleu": bleu, "bleu_multi30k": bleu + 0.3, "chrf": 60.0, "length_ratio": 1.0}


class StandIns:
    """run_step, evaluate_once and translate_blind as the study calls them, each call recorded, writing what the
    real step would: a reproduce run's report, chosen checkpoint and val hypotheses; synthesize's corpus and
    record; evaluate's hypotheses."""

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
            Path(args["output"]).parent.mkdir(parents=True, exist_ok=True)
            for lang, lines in (("en", source), ("de", [f"distilled {i}" for i in range(len(source))])):
                Path(f"{args['output']}.{lang}").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
            done.write_text(json.dumps({"pairs": len(source), "launches": [{"seconds": 2.5}]}))
            return 2.5
        assert command[0] == "transformer_nmt.reproduce"
        run = done.parent
        (run / "checkpoints").mkdir(parents=True)
        shutil.copyfile(self.teacher_ckpt, run / "checkpoints" / "last.ckpt")
        val = TEACHER_VAL[int(args["seed"])] if args["run_id"].startswith("seed_") else self.student_val
        done.write_text(json.dumps({
            "chosen": "last.ckpt", "search": {"beam": 4, "length_penalty": "gnmt", "alpha": 1.4},
            "val_bleu_by_alpha": {"0.6": val - 1, "1": val - 0.5, "1.4": val}, "scores": {"val_beam4": scores(val)},
            "trained": {"steps": int(args["trainer.max_steps"])}, "total_minutes": 60.0,
            "overrides": [*(a for a in command[1:] if a != "test=false"), "run_test=false"]}))
        (run / "results.json").write_text(json.dumps({"run": run.name}))
        (run / "eval").mkdir()
        (run / "eval" / "val_last_beam4_gnmt1.4.hyp").write_text(f"{run.name} val\n")
        return 3600.0

    def evaluate_once(self, ckpt, out, name, options):
        self.evaluations.append((ckpt, name, options))
        split, alpha = (next(o.split("=")[1] for o in options if o.startswith(k)) for k in ("split=", "alpha="))
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.hyp").write_text(f"{name}\n")
        if split == "val":
            return {**scores(ENSEMBLE_VAL[float(alpha)]), "sentences": 4}
        return {**scores(30.0), "sentences": 4}

    def translate_blind(self, ckpt, search, blind, translations, tgt):
        self.blind.append((ckpt, search, translations, tgt))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real trained checkpoint (its data config and vocabulary are read), trained once for the module on a corpus
    its config names relatively (corpus/train)."""
    home = tmp_path_factory.mktemp("teacher")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(home)
        corpus = write_tiny_corpus(Path("corpus"), n_train=12, n_eval=4)
        train(tiny_config(corpus, "trainer.max_steps=1", "trainer.limit_val_batches=0", "validate_at_end=false"),
              home / "teacher")
    return home


@pytest.fixture
def teacher(trained, tmp_path, monkeypatch):
    """The trained checkpoint as every run's chosen model, in a launch directory of the test's own (with the corpus
    the checkpoint names); the CPU answers as one with native bf16, whatever this one's flags."""
    shutil.copytree(trained / "corpus", tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CPU_BF16_ENV, "native")
    return trained / "teacher" / "checkpoints" / "last.ckpt", Path("corpus")


def launch(monkeypatch, stand_ins, *argv):
    study = load_study("best_model")
    for name in ("run_step", "evaluate_once", "translate_blind"):
        monkeypatch.setattr(study, name, getattr(stand_ins, name))
    return study.main(["work=work", "out=out", *argv])


def args(command: list[str]) -> dict:
    return dict(a.split("=", 1) for a in command[1:])


def test_the_student_learns_from_the_ensemble_chosen_on_val_and_only_the_chosen_model_is_scored_on_test(
        teacher, monkeypatch):
    ckpt, corpus = teacher
    stand_ins = StandIns(ckpt, student_val=43.0)
    result = launch(monkeypatch, stand_ins, "student_corpus=both", "student_updates=100")

    reproduce = [args(c) for c in stand_ins.commands if c[0] == "transformer_nmt.reproduce"]
    assert [(r["run_id"], r["seed"], r["trainer.max_steps"]) for r in reproduce] == [
        ("seed_1234", "1234", "5194"), ("seed_2", "2", "5194"), ("best_student_both_7", "7", "100")]
    assert all(r["trainer.max_time"] == "null" and r["test"] == "false" for r in reproduce)
    teachers = [str(RUNS / f"seed_{s}" / "checkpoints" / "last.ckpt") for s in (1234, 2)]
    ensemble = f"[{','.join(teachers)}]"
    val = [e for e in stand_ins.evaluations if "split=val" in e[2]]
    assert [(e[0], e[1]) for e in val] == [(ensemble, f"val_ensemble_beam4_gnmt{a:g}") for a in ENSEMBLE_VAL]

    (synthesize,) = [args(c) for c in stand_ins.commands if c[0] == "transformer_nmt.synthesize"]
    assert (synthesize["ckpt"], synthesize["alpha"], synthesize["input"]) == (ensemble, "1.0", str(corpus / "train.en"))
    assert reproduce[2]["data.train"] == f"[{corpus / 'train'},work/distilled/train]"  # the original pairs too
    assert Path(reproduce[2]["data.tokenizer_path"]).read_bytes()  # the teachers' SentencePiece model, written out
    assert reproduce[2]["trainer.max_epochs"] == "1000"  # the updates end the student, not the recipe's epochs

    steps = {s["step"]: s for s in result["steps"]}
    assert list(steps) == ["teacher, seed 1234", "teacher, seed 2", "ensemble of the 2 teachers",
                           "student on the both corpus"]
    assert steps["ensemble of the 2 teachers"]["val"]["bleu"] == 42.5
    assert steps["ensemble of the 2 teachers"]["search"] == {"beam": 4, "length_penalty": "gnmt", "alpha": 1.0}
    assert result["chosen"] == "student on the both corpus"
    student = str(RUNS / "best_student_both_7" / "checkpoints" / "last.ckpt")
    tests = [e for e in stand_ins.evaluations if "split=test" in e[2]]
    assert [(e[0], e[1]) for e in tests] == [(student, "test_best_student_both_7_beam4_gnmt1.4")]  # once, the chosen
    assert [name for name, s in steps.items() if "test" in s] == ["student on the both corpus"]
    assert result["training_hours"] == round((2 * 5194 + 100) / 5194, 3)
    assert result["synthesis"] == {"pairs": 12, "seconds": 2.5}

    for run in ("seed_1234", "seed_2", "best_student_both_7"):  # each run kept as it ended, val only
        assert json.loads(Path(f"out/{run}_results.json").read_text()) == {"run": run}
        assert Path(f"out/hyps/{run}/val.de").read_text() == f"{run} val\n"
        assert not Path(f"out/hyps/{run}/test.de").exists()
    assert Path("out/hyps/best_model/val.de").read_text() == "best_student_both_7 val\n"
    assert Path("out/hyps/best_model/test.de").read_text() == "test_best_student_both_7_beam4_gnmt1.4\n"
    assert stand_ins.blind == [(student, {"beam": 4, "length_penalty": "gnmt", "alpha": 1.4},
                                Path("docs/quality/blind/best_model"), "de")]  # the chosen model, once
    assert json.loads(Path("out/best_model.json").read_text())["model"] == student

    count = len(stand_ins.commands)
    launch(monkeypatch, stand_ins, "student_corpus=both", "student_updates=100")
    assert len(stand_ins.commands) == count  # every step found done
    with pytest.raises(SystemExit, match=r"another plan \(student_updates: 100 -> 200\)"):
        launch(monkeypatch, stand_ins, "student_corpus=both", "student_updates=200")
    Path("out/choice.json").write_text(json.dumps({"model": "elsewhere.ckpt", "search": {}}))
    tested = len([e for e in stand_ins.evaluations if "split=test" in e[2]])
    blind, kept = len(stand_ins.blind), Path("out/hyps/best_model/test.de").read_text()
    with pytest.raises(SystemExit, match="records another choice .* remove them and out/choice.json first"):
        launch(monkeypatch, stand_ins, "student_corpus=both", "student_updates=100")
    assert len([e for e in stand_ins.evaluations if "split=test" in e[2]]) == tested  # refused before test
    assert Path("out/hyps/best_model/test.de").read_text() == kept and len(stand_ins.blind) == blind


def test_a_run_found_trained_with_other_overrides_or_updates_is_refused(teacher, monkeypatch):
    """A seed_S run the study did not train (the 55-minute hour, or another update count) is not a teacher."""
    ckpt, _ = teacher
    stand_ins = StandIns(ckpt, student_val=42.0)
    run = RUNS / "seed_1234"
    stand_ins.run_step("planted", run / "reproduce.json", [
        "transformer_nmt.reproduce", "run_id=seed_1234", "seed=1234", "trainer.max_steps=3000"])
    with pytest.raises(SystemExit, match=r"another run than this step's \(overrides it lacks: \['trainer.max_time"
                                         r"=null', 'trainer.max_steps=5194'\]; trained 3000 of 5194 updates\)"):
        launch(monkeypatch, stand_ins, "student_updates=10")
    assert len(stand_ins.commands) == 1  # the planted one: nothing trained after it


def test_the_ensemble_when_val_chooses_it_is_scored_on_test_once(teacher, monkeypatch):
    ckpt, _ = teacher
    stand_ins = StandIns(ckpt, student_val=42.0)
    result = launch(monkeypatch, stand_ins, "student_updates=10")
    assert result["chosen"] == "ensemble of the 2 teachers"
    teachers = ",".join(str(RUNS / f"seed_{s}" / "checkpoints" / "last.ckpt") for s in (1234, 2))
    tests = [(e[0], e[1]) for e in stand_ins.evaluations if "split=test" in e[2]]
    assert tests == [(f"[{teachers}]", "test_ensemble_beam4_gnmt1")]
    assert [s["step"] for s in result["steps"] if "test" in s] == ["ensemble of the 2 teachers"]
    assert stand_ins.blind[0][:2] == (f"[{teachers}]", {"beam": 4, "length_penalty": "gnmt", "alpha": 1.0})
    student = next(args(c) for c in stand_ins.commands if "run_id=best_student_distilled_7" in c)
    assert student["data.train"] == "work/distilled/train"  # the distilled pairs alone, by default


def test_one_teacher_is_its_own_search_and_no_ensemble(teacher, monkeypatch):
    ckpt, _ = teacher
    stand_ins = StandIns(ckpt, student_val=38.0)
    result = launch(monkeypatch, stand_ins, "teachers=[5]", "teacher_prefix=mine_", "student_updates=10")
    assert [s["step"] for s in result["steps"]] == ["teacher, seed 5", "student on the distilled corpus"]
    (synthesize,) = [args(c) for c in stand_ins.commands if c[0] == "transformer_nmt.synthesize"]
    assert synthesize["ckpt"] == str(RUNS / "mine_5" / "checkpoints" / "last.ckpt") and synthesize["alpha"] == "1.4"
    assert not [e for e in stand_ins.evaluations if "split=val" in e[2]]  # the teacher's val is reproduce's
    assert result["chosen"] == "teacher, seed 5"


@pytest.mark.parametrize("argv, message", [
    (["student_updates=20000"], r"the plan trains 5\.851 hours .* over budget_hours=4"),
    (["teachers=[1,1]"], "a seed twice"),
    (["teachers=[]"], "at least one seed"),
    (["teacher_prefix=a/b_"], "no directory"),
    (["student_corpus=original"], "student_corpus='original'"),
])
def test_a_plan_that_cannot_run_is_refused_before_any_step(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CPU_BF16_ENV, "native")
    stand_ins = StandIns(tmp_path / "none.ckpt", student_val=0.0)
    with pytest.raises(SystemExit, match=message):
        launch(monkeypatch, stand_ins, *argv)
    assert stand_ins.commands == [] and not Path("work").exists()


def test_where_auto_picks_fp32_the_bf16_budget_is_refused_naming_the_way_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CPU_BF16_ENV, "emulated")
    stand_ins = StandIns(tmp_path / "none.ckpt", student_val=0.0)
    with pytest.raises(SystemExit, match=f"auto picks 32-true here .* set {CPU_BF16_ENV}=native"):
        launch(monkeypatch, stand_ins)
    assert stand_ins.commands == []


def test_an_ensembles_evaluation_is_reused_until_a_member_changes(tmp_path):
    """study_steps.reusable on an ensemble: evaluate records ``ckpt`` as a list, the study names it ``[A,B]``."""
    import os

    steps = load_study("study_steps")
    members = [tmp_path / "a.ckpt", tmp_path / "b.ckpt"]
    for member in members:
        member.write_bytes(b"x")
        os.utime(member, (1_000, 1_000))
    record = tmp_path / "val.json"
    record.write_text(json.dumps({"provenance": {"config": {"options": {
        "ckpt": [str(m) for m in members], "split": "val", "beam": 4}}}}))
    value = steps.model_argument(members)
    assert value == f"[{members[0]},{members[1]}]" and steps.model_files(value) == members
    assert steps.reusable(record, [f"ckpt={value}", "split=val", "beam=4"])
    assert not steps.reusable(record, [f"ckpt={value}", "split=val", "beam=5"])
    assert not steps.reusable(record, [f"ckpt=[{members[1]},{members[0]}]", "split=val", "beam=4"])  # other order
    os.utime(members[1], None)  # a member written after the record
    assert not steps.reusable(record, [f"ckpt={value}", "split=val", "beam=4"])


def test_the_docs_table_shows_each_step_on_val_and_test_only_for_the_chosen_one(teacher, monkeypatch):
    """scripts/docs_tables.py's quality-best-model block, from what the study commits: while it runs (the kept
    reports) and once it has ended (best_model.json)."""
    ckpt, _ = teacher
    spec = importlib.util.spec_from_file_location("docs_tables_best", STUDIES.parent / "scripts" / "docs_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    root = Path(".").resolve()
    assert tables.best_model(root) == "No step of the study has finished yet."
    seeds = Path("docs/quality/seeds")
    seeds.mkdir(parents=True)
    (seeds / "seed_1234_reproduce.json").write_text(json.dumps({"scores": {"val_beam4": scores(40.0)}}))
    (seeds / "seed_1234_results.json").write_text("{}")
    launch(monkeypatch, StandIns(ckpt, student_val=42.0), "student_updates=2597", "out=docs/quality/best")

    lines = tables.best_model(root).splitlines()
    assert lines[0] == ("| step | updates | hours of the budget | minutes here | search | val (cased) | "
                        "val (convention) | val chrF | test (convention) |")
    assert lines[2] == "| teacher, seed 1234 | 5,194 | 1.00 | 60 | beam 4, gnmt 1.4 | 40.00 | 40.30 | 60.00 | - |"
    assert lines[4] == ("| ensemble of the 2 teachers | 0 | 0.00 | - | beam 4, gnmt 1 | 42.50 | 42.80 | 60.00 | "
                        "**30.30** (30.00 cased) |")
    assert lines[5].startswith("| student on the distilled corpus | 2,597 | 0.50 | 60 |") and lines[5].endswith("| - |")
    assert lines[7].startswith("Chosen on val: ensemble of the 2 teachers. Training: 2.5 hours of the budget")
    assert "12 pairs in 0.0 minutes here" in lines[7]
    assert lines[7].endswith("teacher, seed 1234: val scores equal to seed_1234's (the same seed and updates).")
    assert ("chosen on val, ensemble of the 2 teachers gives **30.30** in the convention on test (30.00 cased), in "
            "2.5 hours") in tables.readme_best_model(root)

    Path("docs/quality/best/best_model.json").unlink()  # as while the study runs: the kept reports only
    lines = tables.best_model(root).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:5]] == ["| seed_1234", "| seed_2", "| best_student_distilled_7"]
    assert all(line.endswith("| - |") for line in lines[2:5])  # no test score before the study chooses
    assert lines[6].startswith("The study has not ended")
    assert "3 of its runs finished so far, and no test score until it chooses" in tables.readme_best_model(root)
