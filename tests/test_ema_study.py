"""studies/ema_study.py on a tiny run trained with train.ema_decay: the four models it scores are the trained and the
averaged weights of the newest checkpoints, alone and averaged (each the mean of exactly those weights), the
choice is made on val, and the JSON records every row."""

import json
from pathlib import Path

import torch
from study_scripts import load_study
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import read_checkpoint
from transformer_nmt.inference.average import last_checkpoints
from transformer_nmt.training.app import train
from transformer_nmt.training.ema import CKPT_RAW_WEIGHTS


def study_module():
    return load_study("ema_study")


def mean(tensors):
    return torch.stack([t.double() for t in tensors]).mean(0)


def test_the_four_models_are_the_trained_and_averaged_weights_alone_and_averaged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the run records its data paths relative: evaluate reads them from here
    corpus = write_tiny_corpus(Path("corpus"))
    run = tmp_path / "run"
    train(tiny_config(corpus, "trainer.max_steps=7", "trainer.val_check_interval=2", "train.ema_decay=0.9",
                      "checkpoint.recent.keep=3"), run)
    recent = last_checkpoints(run / "checkpoints" / "recent", 3)
    assert len(recent) == 3
    result = study_module().main([f"run={run}", "last=3", "splits=[val]", "beam=1", "out=study.json"])
    rows = result["groups"]["weights"]
    assert [r["name"] for r in rows] == ["newest trained weights", "trained weights averaged over 3",
                                         "newest moving average", "moving averages averaged over 3"]
    saved = [read_checkpoint(p) for p in recent]
    decoded = {r["name"]: read_checkpoint(r["checkpoints"][0])["state_dict"] for r in rows}
    for key in saved[-1]["state_dict"]:
        if not saved[-1]["state_dict"][key].is_floating_point():
            continue
        raw = [c[CKPT_RAW_WEIGHTS][key] for c in saved]
        average = [c["state_dict"][key] for c in saved]
        assert torch.equal(decoded["newest trained weights"][key], raw[-1]), key
        assert torch.equal(decoded["newest moving average"][key], average[-1]), key
        torch.testing.assert_close(decoded["trained weights averaged over 3"][key].double(), mean(raw))
        torch.testing.assert_close(decoded["moving averages averaged over 3"][key].double(), mean(average))
    assert any(not torch.equal(decoded["newest trained weights"][k], decoded["newest moving average"][k])
               for k in decoded["newest moving average"])
    # A 7-step model's rows may tie on val: the choice is the first row with the highest val BLEU (the rule itself
    # is tested with distinct and tied scores below).
    top = max(r["val"]["bleu"] for r in rows)
    assert result["chosen"] == {"weights": next(r["name"] for r in rows if r["val"]["bleu"] == top)}
    written = json.loads((tmp_path / "study.json").read_text())
    assert written["ema"] == {"decay": 0.9, "warmup": True, "updates": 6}  # the newest checkpoint: step 6
    assert len(written["groups"]["weights"]) == 4
    assert all(set(r["val"]) >= {"bleu", "bleu_multi30k", "chrf", "length_ratio"} for r in written["groups"]["weights"])


def test_the_choice_is_the_row_with_the_best_val_bleu_never_test():
    choose = load_study("ensemble_study").choose_on_val  # ema_study chooses with it
    rows = [{"name": name, "val": {"bleu": v}, "test": {"bleu": t}}
            for name, v, t in (("a", 10.0, 50.0), ("b", 12.5, 1.0), ("c", 12.0, 60.0), ("d", 12.5, 0.0))]
    assert choose(rows, "val") == "b"  # the highest val; on a tie with d, the first; test's 60 ignored
    assert choose(rows[2:], "val") == "d"
    assert choose([], "val") is None
