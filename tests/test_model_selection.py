"""Model selection on BLEU: best-k and early stopping by checkpoint.monitor, several validation sets each logged
under its own name, and the in-loop val BLEU equal to `evaluate split=val beam=1` on the same checkpoint."""

import json

import pytest
from lightning.pytorch.callbacks import EarlyStopping
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.training.app import ConfigError, train, validate_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny run validated on two sets: 4 of its 8 training pairs and 4 unseen ones (so that BLEU is neither 0
    nor 100 within seconds: the model learns its training pairs by heart) and Multi30k's val pairs; checkpoints
    ranked by val BLEU over the whole first set, early stopping after 2 validations without a better one."""
    root = tmp_path_factory.mktemp("selection")
    corpus = write_tiny_corpus(root / "corpus", n_train=8)
    for lang in ("en", "de"):
        seen = (corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:4]
        unseen = (corpus / f"val.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:4]
        (corpus / f"mixed.{lang}").write_text("".join(seen + unseen), encoding="utf-8")
    cfg = tiny_config(corpus, f"data.val=[{corpus}/mixed,{corpus}/val]", "checkpoint.monitor=val_bleu",
                      "checkpoint.patience=2", "checkpoint.save_top_k=1", "train.val_bleu_max_sentences=null",
                      "trainer.max_steps=100", "trainer.check_val_every_n_epoch=50", "train.lr_factor=0.2",
                      "train.warmup_steps=10", "train.label_smoothing=0.0", "seed=3")
    trainer = train(cfg, root / "run")
    return trainer, root / "run", corpus


def test_every_validation_set_is_logged_under_its_own_name(run):
    trainer, run_dir, _ = run
    metrics = trainer.callback_metrics
    for name, pairs in (("val", 8), ("val_val", 24)):
        assert f"{name}/bleu" in metrics and f"{name}/loss" in metrics and float(metrics[f"{name}/ppl"]) > 1
        assert float(metrics[f"{name}/bleu_sentences"]) == pairs  # max_sentences null: the whole set
    assert float(metrics["val/loss"]) < float(metrics["val_val/loss"])  # half of it learnt by heart
    stop = next(c for c in trainer.callbacks if isinstance(c, EarlyStopping))
    best = trainer.checkpoint_callback
    assert (stop.monitor, stop.mode, stop.patience) == ("val/bleu", "max", 2)
    assert (best.monitor, best.mode) == ("val/bleu", "max")
    assert json.loads((run_dir / "results.json").read_text())["val_bleu"] == \
        pytest.approx(float(metrics["val/bleu"]), abs=1e-3)


def test_in_loop_val_bleu_equals_evaluate_split_val_beam_1(run, tmp_path):
    trainer, _, _ = run
    best = trainer.checkpoint_callback
    logged = float(best.best_model_score)  # the val/bleu of the validation that wrote the best checkpoint
    result = evaluate_main([f"ckpt={best.best_model_path}", "split=val", "beam=1", f"out={tmp_path}",
                           "trust_data_paths=true"])  # the run's data: a temporary directory
    assert result["sentences"] == 8
    assert round(result["bleu"], 2) == round(logged, 2)
    assert 5 < logged < 95  # a real comparison, not 0 == 0 or 100 == 100


def test_early_stopping_stops_on_the_monitored_metric(run):
    trainer, _, _ = run
    stop = next(c for c in trainer.callbacks if isinstance(c, EarlyStopping))
    if trainer.global_step < 100:  # it stopped the run: 2 validations in a row did not beat the best
        assert stop.wait_count >= 2 and stop.stopped_epoch > 0
    else:
        assert stop.wait_count < 2


@pytest.mark.parametrize("overrides,message", [
    (["checkpoint.monitor=bleu"], "checkpoint.monitor='bleu': use one of"),
    (["checkpoint.monitor=val_bleu", "train.val_bleu_max_sentences=0"], "checkpoint.monitor=val_bleu needs val BLEU"),
    (["checkpoint.patience=0"], "checkpoint.patience=0: give validations >= 1"),
])
def test_bad_monitor_or_patience_is_named(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(tiny_config(tmp_path, *overrides))
