"""Two-process DDP on CPU (gloo) in bf16-mixed, through the documented launch (``python -m transformer_nmt.train
... trainer=ddp trainer.devices=2``): ranks see different batches, end with identical weights and moving averages,
and agree on the validation BLEU computed over the hypotheses of both; one run dir, the attention maps drawn by
rank 0 alone, and a resume when the same command runs again. One launch and its resume prove it all (each DDP
launch starts two processes that import torch and Lightning); 32-true under this launcher is not run (the launch does
not depend on the precision; 32-true DDP runs under torchrun in test_multinode.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from tensorboard_events import image_samples, read_events
from tiny_corpus import tiny_overrides, write_tiny_corpus

import transformer_nmt

STEPS = 4  # each rank gets 5 batches an epoch: one validation, at step STEPS, inside the first epoch


def recorded(out: Path) -> tuple[list[dict], list[dict]]:
    """What tests/ddp_record.py wrote for ranks 0 and 1 at the end of the last fit: (rank records, weights)."""
    return ([json.loads((out / f"rank{r}.json").read_text()) for r in range(2)],
            [torch.load(out / f"weights{r}.pt", weights_only=True) for r in range(2)])


def test_trainer_ddp_in_bf16_trains_ranks_on_different_batches_into_one_run_dir_and_resumes_when_run_again(tmp_path):
    """Lightning's own launcher starts the second process with the first's run dir (the time-stamped one: no job
    id); only the first writes .hydra/ and train.log, and rank 0 alone draws the attention maps and logs their
    cost; run again into that dir, both processes resume the checkpoint the first chose."""
    corpus = write_tiny_corpus(tmp_path / "corpus")
    out = tmp_path / "record"
    out.mkdir()
    src = Path(transformer_nmt.__file__).resolve().parents[1]
    tests = Path(__file__).resolve().parent  # ddp_record
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(src), str(tests), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "transformer_nmt.train",
               *[a for a in tiny_overrides(corpus) if a not in ("trainer=cpu", "trainer.precision=32-true")],
               "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=bf16-mixed",
               "train.ema_decay=0.9", "train.val_bleu_max_sentences=24", "checkpoint.save_top_k=0", "name=ddp",
               f"trainer.val_check_interval={STEPS}", "attention_maps.every_n_validations=1",
               "attention_maps.n_probes=1"]
    record = ["+callbacks.record._target_=ddp_record.Record", f"+callbacks.record.out='{out}'"]
    first = subprocess.run([*command, f"trainer.max_steps={STEPS}", *record], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stderr[-4000:]

    ranks, weights = recorded(out)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == STEPS
    seen = [{i for batch in r["batches"] for i in batch} for r in ranks]
    assert not seen[0] & seen[1], "the two ranks trained on the same pairs"

    for name, final in weights[0]["final"].items():
        assert torch.equal(final, weights[1]["final"][name]), f"{name} differs between ranks"
    assert any(not torch.equal(weights[0]["final"][k], weights[0]["initial"][k]) for k in weights[0]["final"])
    # train.ema_decay: every rank holds the same moving average, which is not the trained weights
    average = [w["average"] for w in weights]
    assert average[0].keys() == average[1].keys() and len(average[0]) == len(weights[0]["final"])
    for name, value in average[0].items():
        assert torch.equal(value, average[1][name]), f"the average of {name} differs between ranks"
    assert all(not torch.equal(value, weights[0]["final"][name.removeprefix("model.")])
               for name, value in average[0].items())

    metrics = [r["metrics"] for r in ranks]
    assert "val/bleu" in metrics[0] and metrics[0]["val/bleu"] == metrics[1]["val/bleu"]  # (logged synced)
    # BLEU is over the hypotheses of both ranks: all 24 sentences below the limit, not one rank's share; each rank
    # holds the same gathered hypotheses (what the significance tests read), not its own half
    assert metrics[0]["val/bleu_sentences"] == metrics[1]["val/bleu_sentences"] == 24
    assert len(ranks[0]["hypotheses"]) == 24 and ranks[0]["hypotheses"] == ranks[1]["hypotheses"]

    runs = list((tmp_path / "outputs" / "ddp").iterdir())
    assert len(runs) == 1, runs  # one run dir for both processes
    run_dir = runs[0]
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "train_ddp_process_1.log").is_file()
    assert "GLOBAL_RANK: 1" not in (run_dir / "train.log").read_text()  # rank 1 logs to its own file
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == STEPS
    events = read_events(run_dir / "tensorboard")
    images = [t for t in events.Tags()["tensors"] if t.startswith("attention/")]
    assert len(images) == 2 * (2 + 2 * 2)  # tiny model: 2 heads, 2 + 2 layers; once each, not once per rank
    assert all([(step, len(samples)) for step, samples in image_samples(events, tag)] == [(STEPS, 1)]
               for tag in images)
    assert [e.step for e in events.Scalars("attention_maps/seconds")] == [STEPS]
    assert [e.step for e in events.Scalars("attention_maps/render_seconds")] == [STEPS]
    # rank 1 draws nothing (its logger would drop the images, but the probes would still cost it a forward pass)
    assert f"attention maps at step {STEPS}:" in (run_dir / "train.log").read_text()
    assert "attention maps at step" not in (run_dir / "train_ddp_process_1.log").read_text()

    # the same command (the recording callback is part of the run's settings: the resume guard holds it too)
    again = subprocess.run([*command, f"trainer.max_steps={STEPS + 1}", *record, f"hydra.run.dir={run_dir}"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-4000:]
    assert list((tmp_path / "outputs" / "ddp").iterdir()) == [run_dir]
    resumed = f"from {last}, step {STEPS} (ckpt_path=auto)"
    assert f"resume      {resumed}" in (run_dir / "train.log").read_text()
    assert f"rank 1 resumes as global rank 0 chose: {resumed}" in (run_dir / "train_ddp_process_1.log").read_text()
    assert torch.load(last, weights_only=True)["global_step"] == STEPS + 1
    # both ranks started the resumed fit from the first launch's final weights, and end equal again
    resumed_ranks, resumed_weights = recorded(out)
    assert [len(r["batches"]) for r in resumed_ranks] == [1, 1]
    for name, final in weights[0]["final"].items():
        assert all(torch.equal(w["initial"][name], final) for w in resumed_weights), f"{name} not resumed"
        assert torch.equal(resumed_weights[0]["final"][name], resumed_weights[1]["final"][name])
    for name, value in resumed_weights[0]["average"].items():
        assert torch.equal(value, resumed_weights[1]["average"][name]), f"the average of {name} differs"
