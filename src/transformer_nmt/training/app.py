"""One training run from a Hydra config (``python -m transformer_nmt.train``): instantiate, fit, test.

``train`` builds the callbacks (conf/callbacks/), the Trainer (conf/trainer/, conf/logger/), the datamodule and the
LightningModule from ``conf/`` (see conf/train.yaml; every option's default and help: training/config.py), after
checking the config's values before anything expensive (``validate_config``; the schema has checked its keys and
types), then fits and tests. What it calls lives in modules named for it: the run dir's lock (run_dir_lock.py) and
its links (planted_links.py), the checkpoint it resumes (resume.py), SLURM's requeue (slurm.py), a fine-tune's
parent (init_from.py), the start-up summary (summary.py), and what the run writes: config.yaml, ``results.json``
and the validation hypotheses beside it (results.py). Everything the run writes goes under Hydra's run directory. A
sweep run again with the same ``sweep_id`` skips the runs that wrote ``results.json`` (results.finished_already)
and resumes the others.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import hydra
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.checkpoint import CKPT_MODEL_CONFIG, MODEL_PREFIX
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.metrics.catalog import build as build_metric
from transformer_nmt.metrics.catalog import check_names, read_options
from transformer_nmt.model.attention import check_attention
from transformer_nmt.provenance import collect as collect_provenance
from transformer_nmt.training.callbacks import (
    LastCheckpoint,
    RecordFingerprint,
    StepBoundaryTimer,
    early_stopping,
    monitored_metric,
)
from transformer_nmt.training.checkpoint_io import AtomicCheckpointIO
from transformer_nmt.training.config import ConfigError, schema_error
from transformer_nmt.training.continuation import ContinuationError, check_keep
from transformer_nmt.training.fingerprint import INIT_RUN_SETTINGS, check_resume
from transformer_nmt.training.init_from import continued_from, read_parent
from transformer_nmt.training.lightning_adapter import quiet_start_up
from transformer_nmt.training.module import TranslationModule
from transformer_nmt.training.non_finite import check_final_losses
from transformer_nmt.training.planted_links import refuse_planted_links
from transformer_nmt.training.precision import trainer_precision
from transformer_nmt.training.results import finished_already, write_config, write_results
from transformer_nmt.training.resume import choose_resume, is_requeue_resume
from transformer_nmt.training.run_dir_lock import run_dir_lock
from transformer_nmt.training.schedules import check_schedule
from transformer_nmt.training.slurm import SlurmRequeue
from transformer_nmt.training.summary import summary
from transformer_nmt.training.time_budget import TimeBudget

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "32", "32-true", "bf16-mixed", "16-mixed")


def validate_config(cfg: DictConfig) -> None:
    """Fail fast, before data preparation, on values that cannot work (unknown keys and wrong types fail
    earlier, when Hydra composes the config over the schemas of training/config.py)."""
    if "vocab_size" in cfg.model:
        raise ConfigError("model.vocab_size is set from the tokenizer at run time: set data.vocab_size instead")
    problem = schema_error(cfg)  # what +KEY=VALUE added past the schema
    if problem:
        raise ConfigError(f"{problem}; python -m transformer_nmt.train --help lists the options")
    model = cfg.model
    check_attention(model.d_model, model.n_heads, model.get("attention"), prefix="model.", error=ConfigError,
                    d_k=model.get("d_k"), d_v=model.get("d_v"))
    if model.get("pad_id", 0) != 0:
        raise ConfigError(f"model.pad_id must be 0, the tokenizer's pad id (got {model.pad_id})")
    data_max = cfg.data.get("max_positions")
    if data_max is not None and model.get("max_positions", 1024) < data_max:
        raise ConfigError(f"model.max_positions ({model.max_positions}) is below data.max_positions ({data_max}), the "
                          f"longest sequence a batch may hold: raise model.max_positions or lower data.max_positions")
    precision = str(cfg.trainer.precision)
    if precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={precision!r} is not supported; use one of {PRECISIONS}")
    if precision == "16-mixed" and cfg.trainer.get("accelerator") == "cpu":
        raise ConfigError("trainer.precision=16-mixed needs a GPU; on CPU use bf16-mixed or 32-true")
    if not 0.0 <= cfg.train.label_smoothing < 1.0:
        raise ConfigError(f"train.label_smoothing must be in [0, 1), got {cfg.train.label_smoothing}")
    check_schedule(cfg.train.get("lr_schedule", "inverse_sqrt"), cfg.train.warmup_steps, error=ConfigError)
    if cfg.trainer.get("accumulate_grad_batches", 1) < 1:
        raise ConfigError("trainer.accumulate_grad_batches must be >= 1")
    if "callbacks" in cfg.trainer:
        raise ConfigError("trainer.callbacks: the run's callbacks are the callbacks group "
                          "(conf/callbacks/default.yaml): add one with +callbacks.NAME._target_=CLASS and "
                          "+callbacks.NAME.ARG=VALUE")
    if cfg.trainer.get("gradient_clip_val") is not None:
        raise ConfigError("trainer.gradient_clip_val: the module clips the gradients itself, after unscaling them "
                          "by the step's target tokens; set train.clip_grad_norm instead and drop "
                          "trainer.gradient_clip_val")
    try:  # checkpoint.monitor and checkpoint.patience, the validation metrics, before the data is prepared
        early_stopping(cfg.checkpoint.patience, cfg.checkpoint.monitor, cfg.train.val_bleu_max_sentences)
        options = read_options(cfg.get("metric"))
        for name in validation_metrics(cfg):
            build_metric(name, options, option="train.val_metrics").check()  # a COMET directory that is not one
    except ValueError as error:
        raise ConfigError(str(error)) from None
    recent = cfg.checkpoint.recent
    if recent.every_n_train_steps and recent.every_n_minutes:
        raise ConfigError("checkpoint.recent: set every_n_train_steps or every_n_minutes, not both")
    try:
        check_keep(cfg.get("init_keep"), cfg.get("init_from"))
    except ContinuationError as error:
        raise ConfigError(str(error)) from None


def batch_seed(cfg: DictConfig) -> int:
    """The seed of the batch order: data.seed, or the run's seed where data.seed is null (the default), so
    that one ``seed=`` sweep axis varies initialisation, dropout and data order together."""
    return cfg.seed if cfg.data.get("seed") is None else cfg.data.seed


def validation_metrics(cfg: DictConfig) -> list[str]:
    """``train.val_metrics`` (checked) and the metric ``checkpoint.monitor`` ranks by, where it is not among them."""
    names = check_names(cfg.train.val_metrics, "train.val_metrics")
    monitored = monitored_metric(cfg.checkpoint.monitor, cfg.train.val_bleu_max_sentences)
    return names + ([monitored] if monitored is not None and monitored not in names else [])


def build_module(cfg: DictConfig, tokenizer, init: dict | None = None) -> TranslationModule:
    """The module for ``cfg``; with ``init`` (init_from's checkpoint, as init_from.read_init gives it) its architecture
    and weights."""
    model_config = {**OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": tokenizer.vocab_size}
    if init is not None:
        model_config = {**init[CKPT_MODEL_CONFIG], **{k: model_config[k] for k in INIT_RUN_SETTINGS}}
        if model_config.get("max_positions", 1024) < cfg.data.max_positions:
            raise ConfigError(f"init_from={cfg.init_from} holds max_positions {model_config['max_positions']}, "
                              f"below data.max_positions ({cfg.data.max_positions}): lower data.max_positions")
    train_config = {**OmegaConf.to_container(cfg.train, resolve=True), "val_metrics": validation_metrics(cfg)}
    data_config = OmegaConf.to_container(cfg.data, resolve=True)
    metric_options = OmegaConf.to_container(cfg.metric, resolve=True) if cfg.get("metric") is not None else None
    module = TranslationModule(model_config, train_config, tokenizer=tokenizer, seed=cfg.seed, data_config=data_config,
                               metric_options=metric_options)
    if init is not None:
        module.model.load_state_dict({k[len(MODEL_PREFIX):]: v for k, v in init["state_dict"].items()
                                      if k.startswith(MODEL_PREFIX)})
    return module


def build_callbacks(cfg: DictConfig, overrides: Sequence[str] = ()) -> list[pl.Callback]:
    """The ``callbacks`` entries (conf/callbacks/default.yaml), built in order (an entry set to null, or whose
    factory returns None, is left out), after ``RecordFingerprint``, which writes the run's fingerprint and
    ``overrides`` into every checkpoint."""
    callbacks = [RecordFingerprint(cfg, list(overrides))]
    for name, node in cfg.callbacks.items():
        callback = hydra.utils.instantiate(node, _convert_="all") if node is not None else None
        if callback is not None:
            callbacks.append(callback)
    last = next((i for i, c in enumerate(callbacks) if isinstance(c, LastCheckpoint)), None)
    if last is not None and any(isinstance(c, ModelCheckpoint) for c in callbacks[last:]):
        # Lightning saves them in list order: a last.ckpt written before a ModelCheckpoint lacks its newest state
        raise ConfigError("callbacks: the LastCheckpoint entry must come after every ModelCheckpoint entry")
    return callbacks


def with_run_dir(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """A copy of ``cfg`` whose ``run_dir`` (what the callbacks' and the logger's ``${run_dir}`` mean) is ``run_dir``;
    the option is the app's to set."""
    if cfg.get("run_dir") not in (None, str(run_dir)):
        raise ConfigError(f"run_dir={cfg.run_dir} is set by the app (to {run_dir}); choose the directory with "
                          f"hydra.run.dir=DIR or run_id=NAME instead")
    cfg = copy.deepcopy(cfg)  # the caller's config stays as it was
    cfg.run_dir = str(run_dir)
    return cfg


def build_trainer(cfg: DictConfig, run_dir: Path, callbacks: list[pl.Callback]) -> pl.Trainer:
    """The Trainer of ``cfg.trainer``, with ``callbacks``; ``trainer.max_time`` becomes a StepBoundaryTimer (it
    stops on an optimizer step's boundary, not inside gradient accumulation)."""
    cfg = with_run_dir(cfg, run_dir)
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_args["precision"] = trainer_precision(cfg)[0]
    max_time = trainer_args.pop("max_time", None)
    if max_time is not None:
        callbacks = [*callbacks, StepBoundaryTimer(duration=max_time)]
    if trainer_args.get("strategy") == "ddp":  # the model's only buffer, the position table, is never trained
        trainer_args["strategy"] = DDPStrategy(broadcast_buffers=False)
    logger = hydra.utils.instantiate(cfg.logger, _convert_="all") if cfg.get("logger") else False
    checkpoint_io = AtomicCheckpointIO(time_budget=TimeBudget.of(callbacks))  # times its writes in the run's budget
    quiet_start_up()  # before the Trainer logs its advertisement
    return pl.Trainer(**trainer_args, callbacks=callbacks, logger=logger, plugins=[checkpoint_io],
                      default_root_dir=str(run_dir), use_distributed_sampler=False)


def train(cfg: DictConfig, run_dir: str | Path, overrides: Sequence[str] = (),
          sweep: bool = False) -> pl.Trainer | None:
    """Fit and test one configuration, write ``run_dir/results.json`` (results.run_results; ``overrides``: the
    command line's, recorded there and in the checkpoints; ``sweep``: a job of a multirun, which resumes only a
    checkpoint written with the same overrides, and is skipped where it finished already, returning None); returns
    the trainer (metrics in ``trainer.callback_metrics``). A run dir whose ``checkpoints/``, ``tensorboard/`` or a
    file written in place is a link is refused (planted_links.refuse_planted_links; a file the run replaces
    atomically may be one: it is replaced, the command refuses that too). The run holds its directory's lock
    throughout, the sweep's skip decision included (run_dir_lock.run_dir_lock), and under SLURM a requeue signal
    requeues it wherever it is (slurm.SlurmRequeue.whole_run)."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    cfg = with_run_dir(cfg, run_dir)
    validate_config(cfg)
    callbacks = build_callbacks(cfg, overrides)
    requeue = next((c for c in callbacks if isinstance(c, SlurmRequeue)), None)
    refuse_planted_links(run_dir, replaced=False)  # checkpoints/, tensorboard/: written into, never through a link
    with run_dir_lock(run_dir, wait=cfg.wait_for_run_dir):  # the skip decision too: no other launch writes there
        if sweep and finished_already(cfg, run_dir, overrides):
            return None
        with requeue.whole_run(run_dir) if requeue else nullcontext():
            return _fit_and_test(cfg, run_dir, overrides, sweep, callbacks, started)


def _fit_and_test(cfg: DictConfig, run_dir: Path, overrides: Sequence[str], sweep: bool,
                  callbacks: list[pl.Callback], started: float) -> pl.Trainer:
    """``train``'s run, inside its lock and signal handling: instantiate, fit, test."""
    provenance = collect_provenance(OmegaConf.to_container(cfg, resolve=True))  # the load at the start
    trainer = build_trainer(cfg, run_dir, callbacks)
    ckpt_path, resume = choose_resume(cfg.ckpt_path, run_dir, trainer)  # as global rank 0 chose it
    # the run dir's checkpoint must be this run's: its fingerprint, with this trainer's world size and precision
    check_resume(cfg, ckpt_path, list(overrides) if sweep else None, trainer=trainer,  # as rank 0 decided:
                 own_checkpoint=cfg.ckpt_path in ("auto", "last") or is_requeue_resume(resume))
    if rank_zero_only.rank == 0:
        write_config(cfg, run_dir)
    pl.seed_everything(cfg.seed, workers=True)
    parent = read_parent(cfg, ckpt_path, callbacks, trainer)  # init_from: checked before the data is prepared
    # torch.compile: batch widths a multiple of 8 too, so that shapes repeat (and the user's multiple still holds)
    compile_pad = {"pad_to_multiple": math.lcm(cfg.data.pad_to_multiple, 8)} if cfg.train.compile else {}
    datamodule = TranslationDataModule(cfg.data, **compile_pad, seed=batch_seed(cfg),
                                       tokenizer=parent.tokenizer if parent else None)
    datamodule.setup("fit")  # builds or reuses the vocabulary: the model's vocab_size comes from it
    module = build_module(cfg, datamodule.tokenizer, parent.checkpoint if parent else None)
    if rank_zero_only.rank == 0:
        log.info("\n%s", summary(cfg, datamodule, module, trainer, resume))
    with continued_from(parent, ckpt_path, cfg, module, trainer) as start:  # init_keep: the parent's training
        trainer.fit(module, datamodule=datamodule, ckpt_path=start)
    if cfg.get("validate_at_end") and module.validated_at_step != trainer.global_step:
        trainer.validate(module, datamodule=datamodule, verbose=False)  # the final weights, as they are
    metrics = dict(trainer.callback_metrics)  # the last validation's: trainer.test starts from empty metrics
    if cfg.run_test and "test" in datamodule.splits:
        best = trainer.checkpoint_callback.best_model_path  # "" when no validation ran
        trainer.test(module, datamodule=datamodule, ckpt_path=best if best and Path(best).is_file() else None)
        metrics.update(trainer.callback_metrics)
    check_final_losses(metrics, trainer.global_step)  # finite weights that still score NaN: no results
    if rank_zero_only.rank == 0:
        write_results(cfg, module, trainer, datamodule, run_dir, metrics, overrides, time.perf_counter() - started,
                      provenance, parent)
    return trainer
