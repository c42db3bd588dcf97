"""studies/averaging_and_length_penalty.py on a tiny run: one val cell per (checkpoints averaged, exponent), each the
score evaluate gives that average under that length penalty; the choice is val's best, and only it and the recipe's
own setting are scored on test."""

from pathlib import Path

import torch
from study_scripts import load_study
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import read_checkpoint
from transformer_nmt.inference.average import last_checkpoints
from transformer_nmt.inference.evaluate import main as evaluate
from transformer_nmt.training.app import train


def study_module():
    return load_study("averaging_and_length_penalty")


def test_the_grid_scores_each_average_under_each_penalty_and_chooses_on_val(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the run records its data paths relative: evaluate reads them from here
    corpus = write_tiny_corpus(Path("corpus"))
    run = tmp_path / "run"
    train(tiny_config(corpus, "trainer.max_steps=8", "trainer.val_check_interval=2", "checkpoint.recent.keep=3"), run)
    recent = last_checkpoints(run / "checkpoints" / "recent", 3)
    result = study_module().main([f"run={run}", "sizes=[1,3]", "alphas=[0.5,2.0]", "beam=3", "reference=[3,0.5]",
                                  "out=study.json"])
    assert [(c["size"], c["alpha"]) for c in result["grid"]] == [(1, 0.5), (1, 2.0), (3, 0.5), (3, 2.0)]
    average = read_checkpoint(Path("outputs/averaging_and_length_penalty/study/average_last3.ckpt"))["state_dict"]
    saved = [read_checkpoint(p)["state_dict"] for p in recent]
    for key, value in average.items():
        if value.is_floating_point():
            torch.testing.assert_close(value.double(), torch.stack([s[key].double() for s in saved]).mean(0))
    # a cell is evaluate's own score of that model under that search, run here independently
    alone = evaluate([f"ckpt={recent[-1]}", "split=val", "beam=3", "alpha=2.0", "length_penalty=power",
                      f"out={tmp_path / 'check'}"])
    assert result["grid"][1]["val"]["bleu"] == alone["bleu"]
    best = max(result["grid"], key=lambda c: c["val"]["bleu"])
    assert (result["chosen"]["size"], result["chosen"]["alpha"]) == (best["size"], best["alpha"])
    assert "test" in result["chosen"] and "test" in result["reference"]
    assert all("test" not in cell for cell in result["grid"])  # the test set never enters a choice
    assert (result["reference"]["size"], result["reference"]["alpha"]) == (3, 0.5)
    assert result["reference"]["val"] == result["grid"][2]["val"]
