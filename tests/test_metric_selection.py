"""Checkpoint selection on any registered metric: ``checkpoint.monitor=val_NAME`` ranks best-k and early stopping by
that metric in its direction, the best checkpoints named for it; a tiny run selects on COMET read from a tiny local
model directory (tests/tiny_comet.py), its logged value equal to an independent recomputation."""

import json
import re

import pytest
from lightning.pytorch.callbacks import EarlyStopping
from tensorboard_events import read_events
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.training.app import ConfigError, train, validate_config
from transformer_nmt.training.callbacks import best_checkpoint, early_stopping, monitored


@pytest.mark.parametrize("monitor, logged, mode, filename", [
    ("val_bleu", "val/bleu", "max", "step{step:07d}-bleu{val/bleu:.2f}"),  # as before metrics were registered
    ("auto", "val/bleu", "max", "step{step:07d}-bleu{val/bleu:.2f}"),
    ("val_loss", "val/loss", "min", "step{step:07d}-loss{val/loss:.3f}"),
    ("val_ter", "val/ter", "min", "step{step:07d}-ter{val/ter:.2f}"),
    ("val_chrfpp", "val/chrfpp", "max", "step{step:07d}-chrfpp{val/chrfpp:.2f}"),
    ("val_comet", "val/comet", "max", "step{step:07d}-comet{val/comet:.4f}"),
])
def test_the_monitor_derives_the_logged_key_direction_and_file_name(tmp_path, monitor, logged, mode, filename):
    best = best_checkpoint(tmp_path, 2, 500, monitor)
    stop = early_stopping(3, monitor, 500)
    assert (best.monitor, best.mode, best.filename) == (logged, mode, filename)
    assert (stop.monitor, stop.mode) == (logged, mode)
    assert monitored("auto", 0) == ("val/loss", "min")


@pytest.mark.parametrize("overrides, message", [
    (["checkpoint.monitor=val_blue"], "checkpoint.monitor='val_blue': use one of .*'val_comet'"),
    (["checkpoint.monitor=val_ter", "train.val_bleu_max_sentences=0"], "checkpoint.monitor=val_ter needs val ter"),
    (["checkpoint.monitor=val_comet"], "metric comet needs metric.comet.model=DIR"),
    (["train.val_metrics=[bleu,blue]"], "train.val_metrics: no metric named 'blue'"),
])
def test_a_bad_monitor_or_metric_is_named_before_the_data_is_read(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(tiny_config(tmp_path, *overrides))


pytest.importorskip("transformers", reason="COMET needs the optional transformers ([hf])")

from test_metrics import independent_comet  # noqa: E402
from tiny_comet import write_tiny_comet  # noqa: E402 (after the skip: it needs transformers)


@pytest.fixture(scope="module")
def comet_run(tmp_path_factory):
    """A tiny run validated every 5 steps (4 times) on its 8 training pairs, which it learns by heart (so that the
    translations, and their COMET, change between validations); best-2 and early stopping ranked by val COMET."""
    root = tmp_path_factory.mktemp("comet_selection")
    corpus = write_tiny_corpus(root / "corpus", n_train=8, n_eval=8)
    comet_dir = write_tiny_comet(root / "comet", seed=3)
    cfg = tiny_config(corpus, "checkpoint.monitor=val_comet", f"metric.comet.model={comet_dir}",
                      "metric.comet.device=cpu", "checkpoint.save_top_k=2", "checkpoint.patience=50",
                      f"data.val={corpus}/train", "trainer.max_steps=20", "trainer.check_val_every_n_epoch=5",
                      "train.lr_factor=0.2", "train.warmup_steps=10", "train.label_smoothing=0.0", "seed=3")
    trainer = train(cfg, root / "run")
    return trainer, root / "run", comet_dir


def test_a_run_selects_checkpoints_on_val_comet(comet_run):
    trainer, run_dir, comet_dir = comet_run
    best, metrics = trainer.checkpoint_callback, trainer.callback_metrics
    stop = next(c for c in trainer.callbacks if isinstance(c, EarlyStopping))
    assert (best.monitor, best.mode, stop.monitor, stop.mode) == ("val/comet", "max", "val/comet", "max")
    assert "val/bleu" in metrics and "val/comet" in metrics  # train.val_metrics' bleu, and the monitored one
    logged = [round(e.value, 4) for e in read_events(run_dir / "tensorboard").Scalars("val/comet")]
    assert len(logged) == 4 and len(set(logged)) > 2, logged  # values that a wrong direction would rank otherwise
    names = sorted(p.name for p in (run_dir / "checkpoints").glob("step*.ckpt"))
    assert len(names) == 2 and all(re.fullmatch(r"step\d{7}-comet-?\d+\.\d{4}\.ckpt", n) for n in names), names
    kept = sorted(float(re.search(r"comet(-?\d+\.\d{4})", n).group(1)) for n in names)
    assert kept == pytest.approx(sorted(logged)[-2:], abs=1.5e-4)  # the two highest
    results = json.loads((run_dir / "results.json").read_text())
    assert results["val_comet"] == pytest.approx(float(metrics["val/comet"]), abs=1e-4)


def test_the_logged_val_comet_is_comets_formula_over_the_greedy_translations(comet_run):
    trainer, _, comet_dir = comet_run
    module, datamodule = trainer.lightning_module, trainer.datamodule
    hypotheses = module.hypotheses["val"]  # the last validation's, by index
    indices = sorted(hypotheses)
    sources, references = datamodule.sources("val"), datamodule.references("val")
    expected = independent_comet(comet_dir, [(sources[i], hypotheses[i], references[i]) for i in indices])
    assert len(indices) == 8
    assert float(trainer.callback_metrics["val/comet"]) == pytest.approx(sum(expected) / len(expected), abs=1e-5)
