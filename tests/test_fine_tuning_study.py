"""studies/fine_tuning.py on a tiny parent: the new task is the reverse direction on the parent's first pairs and
vocabulary; the fine-tuned runs start from the parent's weights (the frozen one keeps the frozen tensors), the
scratch run does not; every run is scored on the new task and on the parent's own; a second launch redoes nothing."""

from pathlib import Path

import torch
from study_scripts import load_study, train_steps_in_process
from tiny_corpus import tiny_config, tiny_overrides, write_tiny_corpus

from transformer_nmt.checkpoint import checkpoint_tokenizer, read_checkpoint
from transformer_nmt.training.app import train


def study_module():
    return load_study("fine_tuning")


def test_fine_tuned_runs_start_from_the_parent_and_are_scored_on_both_tasks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the runs record their data paths relative: evaluate reads them from here
    corpus = write_tiny_corpus(Path("corpus"), n_train=40, n_eval=8)
    train(tiny_config(corpus, "trainer.max_steps=3", "trainer.limit_val_batches=0", "model.tie_embeddings=false"),
          tmp_path / "parent")
    parent = tmp_path / "parent" / "checkpoints" / "last.ckpt"
    common = [o for o in tiny_overrides(corpus) if not o.startswith("data.train=")] + [
        "trainer.max_steps=2", "trainer.limit_val_batches=0", "validate_at_end=false", "model.tie_embeddings=false"]
    argv = [f"parent={parent}", "experiment=smoke", "overrides=[" + ",".join(f"'{o}'" for o in common) + "]",
            "pairs=16", "seeds=[1]", "beam=2", "splits=[val]", "freeze=[encoder_layers.*]", "out=study.json",
            "work=work"]
    study = study_module()
    trained = train_steps_in_process(monkeypatch, study)  # the train steps in this process
    result = study.main(argv)
    assert trained
    assert Path("work/pairs/train.de").read_text().splitlines() == (corpus / "train.de").read_text().splitlines()[:16]
    parent_ckpt = read_checkpoint(parent)
    runs = {run["kind"]: read_checkpoint(Path(run["run_dir"]) / "checkpoints" / "last.ckpt") for run in result["runs"]}
    for kind, ckpt in runs.items():
        data = ckpt["data_config"]
        assert (data["src_lang"], data["tgt_lang"], data["train"]) == ("de", "en", "work/pairs/train"), kind
        assert checkpoint_tokenizer(ckpt, kind) == checkpoint_tokenizer(parent_ckpt, "parent")
    encoder = [k for k in parent_ckpt["state_dict"] if k.startswith("model.encoder_layers.")]
    frozen, tuned = runs["fine-tuned, frozen"]["state_dict"], runs["fine-tuned"]["state_dict"]
    assert all(torch.equal(frozen[k], parent_ckpt["state_dict"][k]) for k in encoder)  # kept as the parent's
    assert not all(torch.equal(tuned[k], parent_ckpt["state_dict"][k]) for k in encoder)  # trained on
    scratch = runs["from scratch"]["state_dict"]
    assert not any(torch.equal(scratch[k], parent_ckpt["state_dict"][k]) for k in encoder if k.endswith("weight"))
    for run in result["runs"]:
        assert run["scores"]["val"]["sentences"] == 8 and run["parent_task"]["sentences"] == 8
    capsys.readouterr()
    study.main(argv)  # again: every step found done
    assert capsys.readouterr().out.count("done already") == 3
