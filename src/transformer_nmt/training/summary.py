"""The start-up summary a run logs before it fits: parameters, corpus sizes, tokens per optimizer step, devices,
precision, attention kernel, schedule, run dir, what it resumes, and the options set away from their defaults."""

from __future__ import annotations

from dataclasses import fields

import lightning.pytorch as pl
from omegaconf import DictConfig

from transformer_nmt.model.attention import auto_kernel
from transformer_nmt.model.transformer import TransformerConfig
from transformer_nmt.training import roles
from transformer_nmt.training.continuation import KEEPABLE
from transformer_nmt.training.precision import compute_dtype, precision_dependent, trainer_precision
from transformer_nmt.training.schedules import peak_lr


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


def summary(cfg: DictConfig, datamodule, module, trainer: pl.Trainer, resume: str) -> str:
    """Parameters, corpus sizes, tokens per optimizer step, devices, precision, run dir, what it resumes."""
    sizes = ", ".join(f"{name} {split.report.kept:,}" + (f" ({split.epoch_pairs:,} per epoch, upsampled)"
                                                          if split.epoch_pairs != split.report.kept else "")
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
