"""What a run writes of itself in its run dir: its resolved config at the start (``write_config``), at the end the
last validation's hypotheses and ``results.json`` (``write_results``: the model's Table 3 columns, scores,
throughput, where the time went, the results fingerprint), and what a sweep run again reads of it
(``finished_already``)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf

from transformer_nmt import run_files
from transformer_nmt.durable import atomic_write
from transformer_nmt.hardware import reported_cpu_flags
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.training.config import ConfigError
from transformer_nmt.training.continuation import KEEPABLE
from transformer_nmt.training.fingerprint import RESULTS_FINGERPRINT, check_finished_run, results_fingerprint
from transformer_nmt.training.init_from import Parent
from transformer_nmt.training.module import TranslationModule
from transformer_nmt.training.time_budget import TimeBudget

log = logging.getLogger(__name__)


def write_config(cfg: DictConfig, run_dir: Path) -> None:
    """``run_dir/config.yaml``: ``cfg`` resolved, written atomically (a link planted there is replaced)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_text = OmegaConf.to_yaml(cfg, resolve=True)
    atomic_write(run_dir / run_files.CONFIG, lambda f: f.write(config_text.encode("utf-8")))


def write_results(cfg: DictConfig, module: TranslationModule, trainer: pl.Trainer, datamodule, run_dir: Path,
                  metrics: dict, overrides: Sequence[str], wall_seconds: float, provenance: dict | None,
                  parent: Parent | None) -> None:
    """The last validation's hypotheses (``write_hypotheses``), then ``run_dir/results.json`` (``run_results``, with
    the results fingerprint a sweep run again compares, and the parent of a fine-tune), which marks the run
    finished: complete, or not there."""
    results = run_results(module, trainer, metrics, overrides, wall_seconds, cfg.seed, provenance)
    recorded_run = parent.recorded_run if parent is not None else None
    results[RESULTS_FINGERPRINT] = results_fingerprint(cfg, trainer, recorded_run)  # what a sweep rerun compares
    if parent is not None:  # the parent: where it was, what it held, what of its training went on
        results["init_from"] = {"path": str(cfg.init_from), "sha256": parent.digest, "kept": parent.keep,
                                "fresh": [item for item in KEEPABLE if item not in parent.keep]}
    write_hypotheses(module, datamodule, run_dir)  # before results.json, which marks the run finished
    text = json.dumps(results, indent=2, allow_nan=False) + "\n"  # NaN and inf are not JSON
    atomic_write(run_dir / run_files.RESULTS, lambda f: f.write(text.encode()))  # complete, or not there


def run_results(module: TranslationModule, trainer: pl.Trainer, metrics: dict, overrides: Sequence[str],
                wall_seconds: float, seed: int | None = None, provenance: dict | None = None) -> dict:
    """The summary of one run that ``results.json`` holds: the model's Table 3 columns (h, d_k, d_v, d_model,
    N, d_ff, P_drop, eps_ls, positions, parameters), the seed, the last validation's perplexity and BLEU, test
    BLEU when the run tested, mean training throughput (target tokens/s), wall time (the whole run: data,
    fit, test), where it ran (precision, CPU flags that decide its speed, threads), and where the wall time
    went with the training step's model FLOPs utilisation (``time_budget``: time_budget.TimeBudget.report;
    this process's only: a resumed run's earlier launches are not in it), and what made it (``provenance``:
    provenance.collect at the run's start)."""
    c = module.model.config
    d_k, d_v = c.head_dims()

    def metric(key: str) -> float | None:  # null where not measured, or not finite (a perplexity above fp32's range)
        value = float(metrics[key]) if key in metrics else math.nan
        return round(value, 4) if math.isfinite(value) else None

    tokens_per_sec = module.train_tokens_per_sec()
    budget = next((cb for cb in trainer.callbacks if isinstance(cb, TimeBudget)), None)
    return {
        "overrides": list(overrides),
        "seed": seed,
        "n_heads": c.n_heads, "d_model": c.d_model, "d_k": d_k, "d_v": d_v,
        "n_layers": c.n_encoder_layers, "n_decoder_layers": c.n_decoder_layers, "d_ff": c.d_ff, "dropout": c.dropout,
        "label_smoothing": module.optim["label_smoothing"], "positions": c.positions,
        "model": c.to_dict(),  # every field (analysis/ablation.py groups runs by the architecture fields)
        "parameters": module.model.num_parameters(),
        "val_loss": metric("val/loss"), "val_ppl": metric("val/ppl"), "val_bleu": metric("val/bleu"),
        "test_bleu": metric("test/bleu"),
        # each further validation metric (train.val_metrics, the monitored one): val_NAME, test_NAME
        **{f"{split}_{m.name}": metric(f"{split}/{m.name}") for m in module.metrics if m.name != "bleu"
           for split in ("val", "test")},
        "train_tgt_tokens_per_sec": round(tokens_per_sec, 1) if tokens_per_sec is not None else None,
        "steps": trainer.global_step, "epochs": epochs_trained(trainer),
        "planned": {"max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs},
        "wall_seconds": round(wall_seconds, 1),
        "precision": str(trainer.precision), "torch_threads": torch.get_num_threads(),
        "cpu_flags": reported_cpu_flags(),
        "time_budget": budget.report(wall_seconds) if budget is not None else None,
        PROVENANCE_KEY: provenance,
    }


def epochs_trained(trainer: pl.Trainer) -> float | None:
    """Epochs the run's optimizer steps amount to (steps / optimizer steps per epoch of this launch's sampler), to
    a hundredth; None before a training epoch has its length."""
    batches = trainer.num_training_batches
    if not isinstance(batches, int) or batches < 1:
        return None
    per_epoch = max(batches // max(trainer.accumulate_grad_batches, 1), 1)
    return round(trainer.global_step / per_epoch, 2)


def write_hypotheses(module: TranslationModule, datamodule, run_dir: Path) -> None:
    """The last validation's greedy hypotheses and their references, one sentence a line in split order, for
    paired significance tests between runs (transformer_nmt.summarize_ablation); nothing when BLEU was off. Each file
    is written atomically (durable.atomic_write): a link planted in the run dir is replaced, never written through."""
    hypotheses = module.hypotheses.get("val")
    if not hypotheses:
        return
    references = datamodule.references("val")
    indices = sorted(hypotheses)
    for name, lines in ((run_files.HYPOTHESES, [hypotheses[i] for i in indices]),
                        (run_files.REFERENCES, [references[i] for i in indices])):
        text = "".join(" ".join(line.splitlines()) + "\n" for line in lines)
        atomic_write(run_dir / name, lambda f: f.write(text.encode("utf-8")))  # replaces a link, never writes through


def finished_already(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> bool:
    """A sweep run again (same command, same sweep_id) skips the runs that wrote results.json with this command's
    settings (``overrides``: this job's); a run this command only extends (more steps, epochs or time) is not
    skipped: ckpt_path=auto resumes it from its last checkpoint; a finished run with other settings or overrides
    is an error (fingerprint.check_finished_run)."""
    path = run_dir / run_files.RESULTS
    if not path.is_file():
        return False
    try:
        results = json.loads(path.read_text())
    except ValueError as error:  # written atomically since; an older run may have been killed mid-write
        log.warning("%s is not readable JSON (%s): the run is taken as unfinished and runs (or resumes)", path, error)
        return False
    if not isinstance(results, dict):
        raise ConfigError(f"{path} holds no results object: delete it to train this job")
    if check_finished_run(cfg, run_dir, results, list(overrides)):
        return False  # extended: resumed
    log.info("%s exists: this run of the sweep finished already, skipped (delete the file to run it again)", path)
    return True
