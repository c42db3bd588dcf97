"""studies/distillation.py on a tiny teacher: the distilled corpus holds the training sources and the teacher's
translations of them, one line each; both students use the teacher's vocabulary and differ only in their targets;
every run is scored, and a second launch redoes nothing."""

import json
from pathlib import Path

from study_scripts import load_study, train_steps_in_process
from tiny_corpus import tiny_config, tiny_overrides, write_tiny_corpus

from transformer_nmt.checkpoint import checkpoint_tokenizer, read_checkpoint
from transformer_nmt.training.app import train


def study_module():
    return load_study("distillation")


def test_students_learn_from_the_teachers_translations_with_its_vocabulary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the runs record their data paths relative: evaluate reads them from here
    corpus = write_tiny_corpus(Path("corpus"), n_train=40, n_eval=8)
    train(tiny_config(corpus, "trainer.max_steps=3", "trainer.limit_val_batches=0"), tmp_path / "teacher")
    teacher = tmp_path / "teacher" / "checkpoints" / "last.ckpt"
    student = [o for o in tiny_overrides(corpus) if not o.startswith("data.train=")] + [
        "trainer.max_steps=2", "trainer.limit_val_batches=0", "validate_at_end=false"]
    argv = [f"teacher={teacher}", "student=smoke", "student_overrides=[" + ",".join(f"'{o}'" for o in student) + "]",
            "seeds=[1]", "beam=2", "splits=[val]", "out=study.json", "work=work"]
    study = study_module()
    trained = train_steps_in_process(monkeypatch, study)  # the train steps in this process
    result = study.main(argv)
    assert trained
    sources = (corpus / "train.en").read_text().splitlines()
    distilled = Path("work/distilled/train")
    assert Path(f"{distilled}.en").read_text().splitlines() == sources
    targets = Path(f"{distilled}.de").read_text().splitlines()
    assert len(targets) == len(sources) and targets != (corpus / "train.de").read_text().splitlines()
    vocabulary = checkpoint_tokenizer(read_checkpoint(teacher), "teacher")
    runs = {run["corpus"]: run for run in result["runs"]}
    assert sorted(runs) == ["distilled", "original"]
    for name, run in runs.items():
        ckpt = read_checkpoint(Path(run["run_dir"]) / "checkpoints" / "last.ckpt")
        assert checkpoint_tokenizer(ckpt, name) == vocabulary  # one vocabulary: only the targets differ
        assert ckpt["data_config"]["train"] == (str(distilled) if name == "distilled" else str(corpus / "train"))
        assert run["scores"]["val"]["sentences"] == 8
    assert json.loads(Path("study.json").read_text())["mean_bleu"].keys() == {"original", "distilled"}
    capsys.readouterr()
    study.main(argv)  # again: every step found done
    assert capsys.readouterr().out.count("done already") == 3
