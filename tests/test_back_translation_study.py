"""studies/back_translation.py on a tiny corpus: the training split is cut into real pairs and monolingual target
text, the reverse model turns the latter into synthetic sources (one per line), the three forward runs read the
corpora they name (the tagged one with the tag as one piece of the shared vocabulary), every run is scored, and a
second launch redoes nothing."""

from pathlib import Path

from study_scripts import load_study, train_steps_in_process
from tiny_corpus import tiny_overrides, write_tiny_corpus

from transformer_nmt.checkpoint import checkpoint_tokenizer, read_checkpoint


def study_module():
    return load_study("back_translation")


def quoted(overrides: list[str]) -> str:
    return "[" + ",".join(f"'{o}'" for o in overrides) + "]"


def test_the_forward_runs_read_real_back_translated_and_tagged_pairs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the runs record their data paths relative: evaluate reads them from here
    corpus = write_tiny_corpus(Path("corpus"), n_train=40, n_eval=8)
    common = [o for o in tiny_overrides(corpus) if not o.startswith(("data.train=", "data.cache_dir="))] + [
        "data.cache_dir=cache", "trainer.max_steps=2", "trainer.limit_val_batches=0", "validate_at_end=false"]
    argv = ["experiment=smoke", f"overrides={quoted(common)}", f"reverse_overrides={quoted(common)}", "seeds=[1]",
            f"train={corpus}/train", "vocab_size=300", "beam=2", "splits=[val]", "out=study.json", "work=work"]
    study = study_module()
    trained = train_steps_in_process(monkeypatch, study)  # the train steps in this process
    result = study.main(argv)
    assert trained
    de = (corpus / "train.de").read_text().splitlines()
    assert Path("work/split/real.de").read_text().splitlines() == de[:20]
    assert Path("work/split/mono.de").read_text().splitlines() == de[20:]
    assert Path("work/bt/train.de").read_text().splitlines() == de[20:]  # the real German, as it was
    assert len(Path("work/bt/train.en").read_text().splitlines()) == 20  # one synthetic source per line
    reverse = read_checkpoint(Path("work/runs/de_en/checkpoints/last.ckpt"))["data_config"]
    assert (reverse["src_lang"], reverse["tgt_lang"], reverse["train"]) == ("de", "en", "work/split/real")
    runs = {run["corpus"]: read_checkpoint(Path(run["run_dir"]) / "checkpoints" / "last.ckpt")
            for run in result["runs"]}
    assert runs["real"]["data_config"]["train"] == ["work/split/real"]
    assert runs["real + back-translated"]["data_config"]["train"] == ["work/split/real", "work/bt/train"]
    assert runs["real + back-translated"]["data_config"]["train_tags"] is None
    assert runs["real + back-translated, tagged"]["data_config"]["train_tags"] == [None, "<BT>"]
    vocabularies = [checkpoint_tokenizer(ckpt, name) for name, ckpt in runs.items()]
    assert vocabularies[0] == vocabularies[1] == vocabularies[2]  # one vocabulary: only the pairs differ
    assert vocabularies[0].piece_id("<BT>") is not None
    assert all(run["scores"]["val"]["sentences"] == 8 for run in result["runs"])
    capsys.readouterr()
    study.main(argv)  # again: every step found done
    assert capsys.readouterr().out.count("done already") == 5
