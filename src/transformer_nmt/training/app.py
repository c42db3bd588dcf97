"""One training run from a Hydra config (``python -m transformer_nmt.train``): fit, then test.

Builds the datamodule, the LightningModule, callbacks (conf/callbacks/), logger (conf/logger/) and Trainer from
``conf/`` (see conf/train.yaml; every option's default and help: training/config.py), checks the values of
the config before anything expensive (the schema has checked its keys and types), prints a start-up summary, then
``fit`` and ``test``, and writes a summary of the run to ``results.json`` and the validation hypotheses beside
it (``val_hypotheses.txt``, for paired significance tests). Everything the run writes goes
under Hydra's run directory. A sweep run again with the same ``sweep_id`` skips the runs that wrote
``results.json`` (``finished_already``) and resumes the others.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import fields
from pathlib import Path

import hydra
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from transformer_nmt import run_files
from transformer_nmt.checkpoint import (
    CKPT_FINGERPRINT,
    CKPT_MODEL_CONFIG,
    MODEL_PREFIX,
    CheckpointError,
    checkpoint_tokenizer,
    model_config_of,
    read_checkpoint,
)
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.durable import atomic_write
from transformer_nmt.file_digest import content_digest
from transformer_nmt.hardware import reported_cpu_flags
from transformer_nmt.metrics.catalog import build as build_metric
from transformer_nmt.metrics.catalog import check_names, read_options
from transformer_nmt.model.attention import auto_kernel, check_attention
from transformer_nmt.model.transformer import TransformerConfig
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance
from transformer_nmt.training import roles
from transformer_nmt.training.callbacks import LastCheckpoint, StepBoundaryTimer, early_stopping, monitored_metric
from transformer_nmt.training.checkpoint_io import AtomicCheckpointIO
from transformer_nmt.training.config import schema_error
from transformer_nmt.training.continuation import (
    KEEPABLE,
    ContinuationError,
    check_keep,
    check_same_training,
    check_trains_something,
    continuation_checkpoint,
)
from transformer_nmt.training.fingerprint import (
    INIT_DIGEST,
    INIT_RUN_SETTINGS,
    RESULTS_FINGERPRINT,
    RecordFingerprint,
    check_finished_run,
    check_resume,
    recorded_init,
    results_fingerprint,
    run_fingerprint,
)
from transformer_nmt.training.launch import (
    SlurmRequeue,
    agree_on_resume,
    is_requeue_resume,
    refuse_planted_links,
    requeued_resume,
    resume_checkpoint,
    run_dir_lock,
)
from transformer_nmt.training.lightning_adapter import quiet_start_up
from transformer_nmt.training.module import NonFiniteError, TranslationModule, peak_lr
from transformer_nmt.training.precision import compute_dtype, precision_dependent, resolve_precision, uses_cuda
from transformer_nmt.training.time_budget import TimeBudget

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "32", "32-true", "bf16-mixed", "16-mixed")


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what to do."""


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
    if cfg.train.warmup_steps < (1 if cfg.train.get("lr_schedule", "inverse_sqrt") == "inverse_sqrt" else 0):
        raise ConfigError(f"train.warmup_steps={cfg.train.warmup_steps}: the inverse square root schedule peaks at "
                          f"step warmup_steps (>= 1); for no warm-up use train.lr_schedule=constant "
                          f"train.warmup_steps=0")
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


def trainer_precision(cfg: DictConfig) -> tuple[str, str]:
    """(Lightning precision, why): trainer.precision, with ``auto`` resolved for trainer.accelerator."""
    return resolve_precision(str(cfg.trainer.precision), str(cfg.trainer.get("accelerator", "auto")))


def batch_seed(cfg: DictConfig) -> int:
    """The seed of the batch order: data.seed, or the run's seed where data.seed is null (the default), so
    that one ``seed=`` sweep axis varies initialisation, dropout and data order together."""
    return cfg.seed if cfg.data.get("seed") is None else cfg.data.seed


def read_init(path: str) -> dict:
    """``init_from``'s checkpoint, its model config checked before anything is built or prepared
    (checkpoint.model_config_of: fields this version knows, sane sizes, the shapes of the weights it holds); a
    ``ConfigError`` naming ``init_from``, the file and the field otherwise."""
    init = read_checkpoint(path)
    try:
        config = model_config_of(init, f"init_from={path}")
    except CheckpointError as error:
        raise ConfigError(str(error)) from None
    return {**init, CKPT_MODEL_CONFIG: config.to_dict()}


def init_source(cfg: DictConfig, ckpt_path: Path | None) -> tuple[str, dict | None]:
    """(the checkpoint a fine-tune reads its architecture, tokenizer and first weights from, the fingerprint that
    stands for its parent or None): ``init_from``'s file; where that file is gone (a ``recent/`` checkpoint the
    parent's window removed) and the run resumes a checkpoint of its own (``ckpt_path``), that checkpoint, which
    holds all of them (the resume then restores its weights), and the parent's digest and architecture as its
    fingerprint records them (fingerprint.recorded_init). A ``ConfigError`` naming init_from otherwise."""
    init_from = str(cfg.init_from)
    if Path(init_from).is_file():
        return init_from, None
    if ckpt_path is None:
        raise ConfigError(f"init_from={init_from} does not exist: give the checkpoint to fine-tune from")
    recorded = read_checkpoint(ckpt_path, mmap=True).get(CKPT_FINGERPRINT)
    if not recorded_init(recorded):
        raise ConfigError(f"init_from={init_from} does not exist, and {ckpt_path}, the checkpoint this run resumes, "
                          f"records no digest of it: restore init_from's checkpoint to resume")
    log.warning("init_from=%s no longer exists: the run resumes %s, which holds the architecture, tokenizer and "
                "weights, and records the parent's digest (%s)", init_from, ckpt_path, recorded[INIT_DIGEST][:12])
    return str(ckpt_path), recorded


def check_same_vocabulary(init_tokenizer, init_from: str, tokenizer_path: str) -> None:
    """A fine-tune (``init_from``) keeps its checkpoint's vocabulary: the embeddings' rows are its pieces. A
    ``data.tokenizer_path`` naming another SentencePiece model is refused, with the reason; the same one is fine."""
    try:
        given = Tokenizer.load(tokenizer_path)
    except (OSError, RuntimeError, ValueError) as error:
        raise ConfigError(f"data.tokenizer_path={tokenizer_path}: cannot be read ({error})") from None
    if given != init_tokenizer:
        raise ConfigError(f"init_from={init_from} with data.tokenizer_path={tokenizer_path}: that is another "
                          f"vocabulary than the checkpoint's ({given.vocab_size:,} pieces, the checkpoint's "
                          f"{init_tokenizer.vocab_size:,}, or other pieces): the embeddings' rows are the "
                          f"checkpoint's pieces and would no longer match. A fine-tune uses the checkpoint's own "
                          f"vocabulary: drop data.tokenizer_path")


def validation_metrics(cfg: DictConfig) -> list[str]:
    """``train.val_metrics`` (checked) and the metric ``checkpoint.monitor`` ranks by, where it is not among them."""
    names = check_names(cfg.train.val_metrics, "train.val_metrics")
    monitored = monitored_metric(cfg.checkpoint.monitor, cfg.train.val_bleu_max_sentences)
    return names + ([monitored] if monitored is not None and monitored not in names else [])


def build_module(cfg: DictConfig, tokenizer, init: dict | None = None) -> TranslationModule:
    """The module for ``cfg``; with ``init`` (init_from's checkpoint, as ``read_init`` gives it) its architecture
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


def write_continuation(init: dict, keep: list[str], cfg: DictConfig, module: TranslationModule,
                       trainer: pl.Trainer) -> Path:
    """A temporary file holding the checkpoint a fresh run with ``init_keep`` starts from
    (``continuation.continuation_checkpoint``): each process writes its own and removes it after the fit."""
    configured = module.configure_optimizers()  # this run's optimizer and schedule, unstepped (a throwaway)
    scheduler = configured["lr_scheduler"]["scheduler"]
    fresh_optimizer = configured["optimizer"].state_dict()
    # built before the module is on its device: the fused kernel as configure_optimizers picks it on the run's device
    fused = True if cfg.train.fused_adam and uses_cuda(str(cfg.trainer.get("accelerator", "auto"))) else None
    fresh_optimizer["param_groups"] = [{**group, "fused": fused} for group in fresh_optimizer["param_groups"]]
    ema = ({"decay": float(cfg.train.ema_decay), "warmup": bool(cfg.train.get("ema_warmup", True))}
           if cfg.train.get("ema_decay") is not None else None)
    try:
        check_same_training(init, keep, f"init_from={cfg.init_from}", run_fingerprint(cfg, trainer))
        checkpoint = continuation_checkpoint(
            init, keep, f"init_from={cfg.init_from}", fresh_optimizer=fresh_optimizer,
            fresh_scheduler=scheduler.state_dict(), schedule=scheduler.lr_lambdas[0],
            fresh_loops=trainer.fit_loop.state_dict(), training_run=module.training_run, ema=ema)
    except ContinuationError as error:
        raise ConfigError(str(error)) from None
    handle, name = tempfile.mkstemp(prefix="init-keep-", suffix=".ckpt")
    os.close(handle)
    torch.save(checkpoint, name)
    return Path(name)


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


def attention_kernel(kernel: str, trainer: pl.Trainer) -> str:
    """model.attention as the training step runs it: ``auto`` resolved for the device and the precision."""
    if kernel != "auto":
        return f"{kernel} (set in model.attention; plain wherever attention maps are drawn)"
    chosen, why = auto_kernel(trainer.strategy.root_device.type, compute_dtype(trainer.precision))
    return f"{chosen} ({why}; plain wherever attention maps are drawn)"


SUMMARY_MODEL_FIELDS = {"d_model", "n_heads", "d_k", "d_v", "positions", "n_encoder_layers", "n_decoder_layers",
                        "d_ff", "dropout", "vocab_size", "attention", "attention_block_size"}  # named in their places


def changed_model_fields(config: TransformerConfig) -> dict:
    """The model's fields, but those the summary's model line names in their places, that differ from their
    defaults (from the dataclass: a new option shows when set, with no edit here)."""
    return {f.name: getattr(config, f.name) for f in fields(config)
            if f.name not in SUMMARY_MODEL_FIELDS and getattr(config, f.name) != f.default}


def summary(cfg: DictConfig, datamodule, module: TranslationModule, trainer: pl.Trainer, resume: str) -> str:
    """Parameters, corpus sizes, tokens per optimizer step, devices, precision, run dir, what it resumes."""
    sizes = ", ".join(f"{name} {split.report.kept:,}" + (f" ({len(split.keep):,} per epoch, upsampled)"
                                                          if len(split.keep) != split.report.kept else "")
                      for name, split in datamodule.splits.items())
    per_step = datamodule.max_tokens * trainer.accumulate_grad_batches * trainer.world_size
    directions = ", ".join(getattr(datamodule, "pair_specs", None) or [f"{datamodule.src_lang}->{datamodule.tgt_lang}"])
    c = module.model.config
    lines = [
        f"model       {module.model.num_parameters():,} parameters (d_model {c.d_model}, heads {c.n_heads} with d_k "
        f"{c.head_dims()[0]}, d_v {c.head_dims()[1]}, {c.positions} positions, "
        f"layers {c.n_encoder_layers}+{c.n_decoder_layers}, d_ff {c.d_ff}, dropout {c.dropout}, vocab {c.vocab_size}"
        + "".join(f", {name} {value}" for name, value in changed_model_fields(c).items()) + ")",
        f"corpus      {directions} pairs after filtering: {sizes}",
        f"batch       <= {per_step:,} padded tokens per side per optimizer step (data.max_tokens "
        f"{datamodule.max_tokens} x accumulate {trainer.accumulate_grad_batches} x {trainer.world_size} ranks; a "
        f"resume may change the factors, not the product)",
        f"devices     {trainer.num_nodes} node(s) x {trainer.num_devices} {type(trainer.accelerator).__name__}, "
        f"strategy {type(trainer.strategy).__name__}, precision {trainer.precision} ({trainer_precision(cfg)[1]})",
        f"attention   {attention_kernel(c.attention, trainer)}",
        f"schedule    peak lr {peak_lr(module.optim, c.d_model):.3g} at step {cfg.train.warmup_steps} ("
        + ("train.lr" if cfg.train.get("lr") is not None else f"lr_factor {cfg.train.lr_factor}")
        + (f", warmup from {cfg.train.warmup_init_lr:g}" if cfg.train.get("warmup_init_lr") else "")
        + (", then constant)" if cfg.train.get("lr_schedule") == "constant" else ", then inverse sqrt)")
        + f", max_steps {trainer.max_steps}, max_epochs {trainer.max_epochs}",
        *([f"frozen      {module.parameter_counts['frozen']:,} parameters (train.freeze "
           f"{list(cfg.train.freeze)}), {module.parameter_counts['trainable']:,} trainable"]
          if cfg.train.get("freeze") else []),
        *([f"average     exponential moving average of the weights, decay {cfg.train.ema_decay:g}"
           + (" (ramped: min(decay, (1 + t) / (10 + t)))" if cfg.train.get("ema_warmup", True) else "")
           + ": validation, test and checkpoints' decoding weights"]
          if cfg.train.get("ema_decay") is not None else []),
        f"run dir     {trainer.default_root_dir}",
        f"resume      {resume}",
        *roles.summary_lines(cfg),  # the options set away from their defaults, by role: which a resume must keep
    ]
    if cfg.get("init_from"):
        keep = list(cfg.get("init_keep") or [])
        fresh = [item for item in KEEPABLE if item not in keep]
        lines.append(f"init        weights, architecture and tokenizer from {cfg.init_from}"
                     + (f"; continues its {', '.join(keep)}" if keep else "")
                     + (f"; fresh: {', '.join(fresh)}" if fresh else ""))
    chosen = precision_dependent(cfg)
    if chosen:  # the recipe's ${by_precision:...} settings, as chosen for this run's precision
        after = next(i for i, line in enumerate(lines) if line.startswith("devices")) + 1
        lines.insert(after, f"recipe      for {trainer.precision}: " + ", ".join(f"{k} {v}" for k, v in chosen.items()))
    return "\n".join(lines)


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


def train(cfg: DictConfig, run_dir: str | Path, overrides: Sequence[str] = (), sweep: bool = False) -> pl.Trainer:
    """Fit and test one configuration, write ``run_dir/results.json`` (see ``run_results``; ``overrides``:
    the command line's, recorded there and in the checkpoints; ``sweep``: a job of a multirun, which resumes
    only a checkpoint written with the same overrides); returns the trainer (metrics in
    ``trainer.callback_metrics``). A run dir whose ``checkpoints/``, ``tensorboard/`` or a file written in place is
    a link is refused (launch.refuse_planted_links; a file the run replaces atomically may be one: it is replaced,
    the command refuses that too). The run holds its directory's lock throughout (launch.run_dir_lock), and
    under SLURM a requeue signal requeues it wherever it is (launch.SlurmRequeue.whole_run)."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    cfg = with_run_dir(cfg, run_dir)
    validate_config(cfg)
    callbacks = build_callbacks(cfg, overrides)
    requeue = next((c for c in callbacks if isinstance(c, SlurmRequeue)), None)
    refuse_planted_links(run_dir, replaced=False)  # checkpoints/, tensorboard/: written into, never through a link
    with run_dir_lock(run_dir, wait=cfg.wait_for_run_dir), requeue.whole_run(run_dir) if requeue else nullcontext():
        return _fit_and_test(cfg, run_dir, overrides, sweep, callbacks, started)


def _fit_and_test(cfg: DictConfig, run_dir: Path, overrides: Sequence[str], sweep: bool,
                  callbacks: list[pl.Callback], started: float) -> pl.Trainer:
    """``train``'s run, inside its lock and signal handling."""
    provenance = collect_provenance(OmegaConf.to_container(cfg, resolve=True))  # the load at the start
    trainer = build_trainer(cfg, run_dir, callbacks)
    requeued = requeued_resume(cfg.ckpt_path, run_dir)  # a requeued SLURM job resumes what it saved
    choice = requeued or resume_checkpoint(cfg.ckpt_path, run_dir)
    ckpt_path, resume = agree_on_resume(choice, trainer)  # rank 0's choice
    if not trainer.is_global_zero:
        log.info("rank %d resumes as global rank 0 chose: %s", trainer.global_rank, resume)
    # the run dir's checkpoint must be this run's: its fingerprint, with this trainer's world size and precision
    check_resume(cfg, ckpt_path, list(overrides) if sweep else None, trainer=trainer,  # as rank 0 decided:
                 own_checkpoint=cfg.ckpt_path in ("auto", "last") or is_requeue_resume(resume))
    if rank_zero_only.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_text = OmegaConf.to_yaml(cfg, resolve=True)  # atomically: a link planted there is replaced
        atomic_write(run_dir / run_files.CONFIG, lambda f: f.write(config_text.encode("utf-8")))
    pl.seed_everything(cfg.seed, workers=True)
    # torch.compile: batch widths a multiple of 8 too, so that shapes repeat (and the user's multiple still holds)
    compile_pad = {"pad_to_multiple": math.lcm(cfg.data.pad_to_multiple, 8)} if cfg.train.compile else {}
    init_path, recorded_run = init_source(cfg, ckpt_path) if cfg.get("init_from") else (None, None)
    if recorded_run is not None:  # init_from is gone: the parent as this run's own checkpoint records it
        next(c for c in callbacks if isinstance(c, RecordFingerprint)).recorded_run = recorded_run
    init = read_init(init_path) if init_path else None  # fine-tune: weights, tokenizer
    init_digest = (None if init is None else recorded_init(recorded_run)[INIT_DIGEST] if recorded_run is not None
                   else content_digest(init_path))  # the file as it was read
    keep = list(cfg.get("init_keep") or [])
    if keep and ckpt_path is None:  # a continuation that would train nothing is refused before the data is prepared
        try:
            check_trains_something(init, keep, f"init_from={cfg.init_from}", trainer.max_steps, trainer.max_epochs)
        except ContinuationError as error:
            raise ConfigError(str(error)) from None
    init_tokenizer = checkpoint_tokenizer(init, cfg.init_from) if init else None
    if init_tokenizer is not None and cfg.data.get("tokenizer_path"):
        check_same_vocabulary(init_tokenizer, cfg.init_from, cfg.data.tokenizer_path)
    datamodule = TranslationDataModule(cfg.data, **compile_pad, seed=batch_seed(cfg), tokenizer=init_tokenizer)
    datamodule.setup("fit")  # builds or reuses the vocabulary: the model's vocab_size comes from it
    module = build_module(cfg, datamodule.tokenizer, init)
    if rank_zero_only.rank == 0:
        log.info("\n%s", summary(cfg, datamodule, module, trainer, resume))
    continued = None
    if keep and ckpt_path is None:  # a fresh start that continues init_from's training: Lightning restores it
        continued = write_continuation(init, keep, cfg, module, trainer)
        ckpt_path = continued
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    finally:
        if continued is not None:
            continued.unlink(missing_ok=True)
    if cfg.get("validate_at_end") and module.validated_at_step != trainer.global_step:
        trainer.validate(module, datamodule=datamodule, verbose=False)  # the final weights, as they are
    metrics = dict(trainer.callback_metrics)  # the last validation's: trainer.test starts from empty metrics
    if cfg.run_test and "test" in datamodule.splits:
        best = trainer.checkpoint_callback.best_model_path  # "" when no validation ran
        trainer.test(module, datamodule=datamodule, ckpt_path=best if best and Path(best).is_file() else None)
        metrics.update(trainer.callback_metrics)
    losses = {key: float(value) for key, value in metrics.items() if key.endswith("/loss") and key[:4] != "train"}
    bad = {key: value for key, value in losses.items() if not math.isfinite(value)}
    if bad:  # finite weights (checked at the fit's end) that still score NaN: nothing of this run is summarized
        raise NonFiniteError(f"the final weights' {', '.join(f'{k} is {v}' for k, v in bad.items())} (not finite) "
                             f"after optimizer step {trainer.global_step}: results.json is not written")
    if rank_zero_only.rank == 0:
        results = run_results(module, trainer, metrics, overrides, time.perf_counter() - started, cfg.seed,
                              provenance)
        results[RESULTS_FINGERPRINT] = results_fingerprint(cfg, trainer, recorded_run)  # what a sweep rerun compares
        if cfg.get("init_from"):  # the parent: where it was, what it held, what of its training went on
            results["init_from"] = {"path": str(cfg.init_from), "sha256": init_digest,
                                    "kept": keep, "fresh": [item for item in KEEPABLE if item not in keep]}
        write_hypotheses(module, datamodule, run_dir)  # before results.json, which marks the run finished
        text = json.dumps(results, indent=2, allow_nan=False) + "\n"  # NaN and inf are not JSON
        atomic_write(run_dir / run_files.RESULTS, lambda f: f.write(text.encode()))  # complete, or not there
    return trainer


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
