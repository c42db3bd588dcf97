"""init_from with init_keep (training/continuation.py): a run that keeps the optimizer, the schedule, the step and the
data position of a checkpoint trains exactly what resuming the checkpoint's own run trains; each item alone keeps
that and nothing else; the child is its own run; what cannot be kept is refused naming the option."""

import hashlib
import json
import shutil

import pytest
import torch
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import CKPT_RUN, read_checkpoint
from transformer_nmt.training.app import ConfigError, train

STEPS = ("trainer.limit_val_batches=0",)  # no validation: only steps make the checkpoints


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A tiny run stopped after 7 optimizer steps, mid-epoch (the tiny corpus makes 10 batches an epoch)."""
    root = tmp_path_factory.mktemp("continuation")
    corpus = write_tiny_corpus(root / "corpus")
    train(tiny_config(corpus, "trainer.max_steps=7", *STEPS), root / "parent")
    return corpus, root / "parent"


def last(run_dir) -> dict:
    return read_checkpoint(run_dir / "checkpoints" / "last.ckpt")


def adam_steps(checkpoint: dict) -> set[int]:
    return {int(state["step"]) for state in checkpoint["optimizer_states"][0]["state"].values()}


def sampler(checkpoint: dict) -> dict:
    return checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]


def test_keeping_everything_trains_what_resuming_the_parent_trains(parent, tmp_path):
    corpus, parent_dir = parent
    resumed = tmp_path / "resumed"
    shutil.copytree(parent_dir, resumed)
    train(tiny_config(corpus, "trainer.max_steps=15", *STEPS), resumed)  # exact resume, past the epoch's end
    ckpt = parent_dir / "checkpoints" / "last.ckpt"
    train(tiny_config(corpus, f"init_from={ckpt}", "init_keep=[optimizer,schedule,step,data]",
                      "trainer.max_steps=15", *STEPS), tmp_path / "child")
    expected, child = last(resumed), last(tmp_path / "child")
    assert child["global_step"] == expected["global_step"] == 15
    for key, value in expected["state_dict"].items():
        assert torch.equal(child["state_dict"][key], value), key
    for index, state in expected["optimizer_states"][0]["state"].items():
        assert torch.equal(child["optimizer_states"][0]["state"][index]["exp_avg_sq"], state["exp_avg_sq"])
    assert child["lr_schedulers"][0]["last_epoch"] == expected["lr_schedulers"][0]["last_epoch"] == 15
    assert sampler(child) == sampler(expected)
    assert child[CKPT_RUN] != last(parent_dir)[CKPT_RUN] == expected[CKPT_RUN]  # another run: never averaged with it
    assert not list(tmp_path.glob("child/**/init-keep-*"))


@pytest.mark.parametrize("keep", [[], ["optimizer"], ["schedule"], ["step"], ["data"]])
def test_each_item_keeps_its_part_and_nothing_else(parent, tmp_path, keep):
    """7 parent steps, then 8 of the child's: a kept counter reads 15, a fresh one 8."""
    corpus, parent_dir = parent
    ckpt = parent_dir / "checkpoints" / "last.ckpt"
    steps = 8 if "step" not in keep else 15  # max_steps counts the kept step counter
    train(tiny_config(corpus, f"init_from={ckpt}", f"init_keep=[{','.join(keep)}]", f"trainer.max_steps={steps}",
                      *STEPS), tmp_path / "child")
    child = last(tmp_path / "child")
    assert child["global_step"] == (15 if "step" in keep else 8)
    assert adam_steps(child) == {15 if "optimizer" in keep else 8}  # Adam's own per-tensor step counts
    assert child["lr_schedulers"][0]["last_epoch"] == (15 if "schedule" in keep else 8)
    # the data position: 3 batches finish the parent's epoch 0, then 5 of epoch 1; fresh: 8 of epoch 0
    assert (sampler(child)["epoch"], sampler(child)["batches_yielded"]) == ((1, 5) if "data" in keep else (0, 8))
    recorded = json.loads((tmp_path / "child" / "results.json").read_text())["init_from"]
    assert recorded == {"path": str(ckpt), "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest(), "kept": keep,
                        "fresh": [item for item in ("optimizer", "schedule", "step", "data") if item not in keep]}


def test_what_cannot_be_kept_is_refused_naming_the_option(parent, tmp_path):
    corpus, parent_dir = parent
    ckpt = parent_dir / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"init_keep=\['optimizer'\] needs init_from=CKPT"):
        train(tiny_config(corpus, "init_keep=[optimizer]", *STEPS), tmp_path / "a")
    with pytest.raises(ConfigError, match=r"init_keep=\['moments'\]: \['moments'\] not among"):
        train(tiny_config(corpus, f"init_from={ckpt}", "init_keep=[moments]", *STEPS), tmp_path / "b")
    with pytest.raises(ConfigError, match=r"keeping optimizer needs the same train.freeze as init_from="):
        train(tiny_config(corpus, f"init_from={ckpt}", "init_keep=[optimizer]", "train.freeze=[encoder_layers.*]",
                          "trainer.max_steps=9", *STEPS), tmp_path / "c")
    with pytest.raises(ConfigError, match=r"keeping data needs the same data.max_tokens as init_from="):
        train(tiny_config(corpus, f"init_from={ckpt}", "init_keep=[data]", "data.max_tokens=256",
                          "trainer.max_steps=9", *STEPS), tmp_path / "e")
    train(tiny_config(corpus, f"init_from={ckpt}", "init_keep=[step]", "data.max_tokens=256",  # no position kept
                      "trainer.max_steps=9", *STEPS), tmp_path / "f")
    training_state = ("optimizer_states", "lr_schedulers", "loops")
    weights_only = {k: v for k, v in last(parent_dir).items() if k not in training_state}
    torch.save(weights_only, tmp_path / "weights.ckpt")
    with pytest.raises(ConfigError, match=r"holds no 'optimizer_states': it is not a checkpoint of a training run"):
        train(tiny_config(corpus, f"init_from={tmp_path / 'weights.ckpt'}", "init_keep=[step]", *STEPS),
              tmp_path / "d")


def test_init_keep_is_part_of_the_fingerprint(parent, tmp_path):
    """A child's run dir launched again with other init_keep is refused: it would continue another training."""
    from transformer_nmt.training.fingerprint import ResumeError

    corpus, parent_dir = parent
    ckpt = parent_dir / "checkpoints" / "last.ckpt"
    train(tiny_config(corpus, f"init_from={ckpt}", "init_keep=[step]", "trainer.max_steps=9", *STEPS),
          tmp_path / "child")
    with pytest.raises((ResumeError, SystemExit, ValueError), match="init_keep"):
        train(tiny_config(corpus, f"init_from={ckpt}", "init_keep=[data]", "trainer.max_steps=12", *STEPS),
              tmp_path / "child")
