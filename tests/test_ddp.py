"""Two-process DDP on CPU (gloo) in bf16-mixed: ranks see different batches, end with identical weights,
and agree on the validation BLEU computed over the hypotheses of both; through the app, one run dir, a resume,
and the attention maps written by rank 0 alone."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from tensorboard_events import image_samples, read_events
from tiny_corpus import tiny_overrides, write_tiny_corpus

import transformer_nmt
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule

STEPS = 4

# Lightning's "ddp" strategy re-launches this script once per extra rank, with the same arguments.
SCRIPT = textwrap.dedent(f"""
    import json, sys
    from pathlib import Path
    import lightning.pytorch as pl
    import torch
    from transformer_nmt.training.checkpoint_io import AtomicCheckpointIO
    from transformer_nmt.data.config import DataConfig
    from transformer_nmt.data.datamodule import TranslationDataModule
    from transformer_nmt.training.module import TranslationModule

    corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
    pl.seed_everything(0, workers=True)
    datamodule = TranslationDataModule(DataConfig(train=f"{{corpus}}/train", val=f"{{corpus}}/val", test=None,
                                                  cache_dir=f"{{corpus}}/cache", vocab_size=256, max_tokens=512,
                                                  num_proc=1))
    datamodule.setup("fit")
    model_config = dict(vocab_size=datamodule.tokenizer.vocab_size, d_model=32, n_heads=2, n_encoder_layers=1,
                        n_decoder_layers=1, d_ff=64, dropout=0.1)
    module = TranslationModule(model_config, dict(warmup_steps=10, val_bleu_max_sentences=24, ema_decay=0.9),
                               tokenizer=datamodule.tokenizer, seed=0)

    class Record(pl.Callback):
        batches = []

        def on_train_start(self, trainer, pl_module):
            self.initial = {{k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.batches.append(batch["index"].tolist())

        def on_train_end(self, trainer, pl_module):
            rank = trainer.global_rank
            torch.save({{"initial": self.initial, "final": pl_module.model.state_dict(),
                        "average": pl_module.ema.averaged_weights()}}, out / f"weights{{rank}}.pt")
            metrics = {{k: float(v) for k, v in trainer.callback_metrics.items()}}
            (out / f"rank{{rank}}.json").write_text(json.dumps({{"batches": self.batches, "metrics": metrics,
                                                               "world_size": trainer.world_size}}))

    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed", max_steps={STEPS},
                         val_check_interval={STEPS}, num_sanity_val_steps=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False, plugins=[AtomicCheckpointIO()], callbacks=[Record()])
    trainer.fit(module, datamodule=datamodule)
""")


def test_two_cpu_processes_in_bf16_see_different_batches_and_end_with_identical_weights(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus")
    TranslationDataModule(DataConfig(train=f"{corpus}/train", val=f"{corpus}/val", test=None,
                                     cache_dir=f"{corpus}/cache", vocab_size=256, max_tokens=512,
                                     num_proc=1)).setup("fit")  # build caches once, here
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sys.executable, str(script), str(corpus), str(out)], capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]

    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == STEPS
    seen = [{i for batch in r["batches"] for i in batch} for r in ranks]
    assert not seen[0] & seen[1], "the two ranks trained on the same pairs"

    weights = [torch.load(out / f"weights{r}.pt", weights_only=True) for r in range(2)]
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
    assert "val/bleu" in metrics[0] and metrics[0]["val/bleu"] == metrics[1]["val/bleu"]
    # BLEU is over the hypotheses of both ranks: all 24 sentences below the limit, not one rank's share.
    assert metrics[0]["val/bleu_sentences"] == metrics[1]["val/bleu_sentences"] == 24
    assert metrics[0]["val/loss"] == metrics[1]["val/loss"]


def test_trainer_ddp_through_the_app_runs_in_one_run_dir_and_resumes_when_run_again(tmp_path):
    """The documented launch, ``python -m transformer_nmt.train ... trainer=ddp trainer.devices=2`` (on CPU):
    Lightning's own launcher starts the second process with the first's run dir (the time-stamped one: no job
    id), only the first writes .hydra/ and train.log, and rank 0 alone draws the attention maps and logs their
    cost; run again into that dir, both processes resume the checkpoint the first chose."""
    corpus = write_tiny_corpus(tmp_path / "corpus")
    src = Path(transformer_nmt.__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "transformer_nmt.train",
               *[a for a in tiny_overrides(corpus) if a != "trainer=cpu"],
               "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
               "train.val_bleu_max_sentences=0", "checkpoint.save_top_k=0", "name=ddp"]
    maps = ["trainer.val_check_interval=2", "attention_maps.every_n_validations=1", "attention_maps.n_probes=1"]
    first = subprocess.run([*command, "trainer.max_steps=2", *maps], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=240)
    assert first.returncode == 0, first.stderr[-4000:]
    runs = list((tmp_path / "outputs" / "ddp").iterdir())
    assert len(runs) == 1, runs  # one run dir for both processes
    run_dir = runs[0]
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "train_ddp_process_1.log").is_file()
    assert "GLOBAL_RANK: 1" not in (run_dir / "train.log").read_text()  # rank 1 logs to its own file
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2
    events = read_events(run_dir / "tensorboard")
    images = [t for t in events.Tags()["tensors"] if t.startswith("attention/")]
    assert len(images) == 2 * (2 + 2 * 2)  # tiny model: 2 heads, 2 + 2 layers; once each, not once per rank
    assert all([(step, len(samples)) for step, samples in image_samples(events, tag)] == [(2, 1)] for tag in images)
    assert [e.step for e in events.Scalars("attention_maps/seconds")] == [2]
    assert [e.step for e in events.Scalars("attention_maps/render_seconds")] == [2]
    # rank 1 draws nothing (its logger would drop the images, but the probes would still cost it a forward pass)
    assert "attention maps at step 2:" in (run_dir / "train.log").read_text()
    assert "attention maps at step" not in (run_dir / "train_ddp_process_1.log").read_text()

    again = subprocess.run([*command, "trainer.max_steps=3", *maps, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-4000:]
    assert list((tmp_path / "outputs" / "ddp").iterdir()) == [run_dir]
    resumed = f"from {last}, step 2 (ckpt_path=auto)"
    assert f"resume      {resumed}" in (run_dir / "train.log").read_text()
    assert f"rank 1 resumes as global rank 0 chose: {resumed}" in (run_dir / "train_ddp_process_1.log").read_text()
    assert torch.load(last, weights_only=True)["global_step"] == 3
