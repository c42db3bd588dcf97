"""The training and prepare apps' settings: dataclasses whose fields hold every default and its help text.

Hydra composes the apps' configs over these schemas (``register_configs`` puts them in Hydra's ConfigStore):
conf/train.yaml's defaults list starts with ``train_schema`` (``TrainAppConfig``), conf/prepare.yaml's with
``prepare_schema``, and every YAML file under conf/ is a diff over the dataclass defaults. So a typo'd key
under ``model``, ``data``, ``train``, ``checkpoint`` or ``attention_maps`` fails at compose time with
OmegaConf's error naming it, and ``--help`` lists each option with its default and help (``options_help``).
``trainer`` stays a free dict (Lightning Trainer keyword arguments); ``callbacks`` and ``logger`` hold
``_target_`` entries (conf/callbacks/, conf/logger/). No Lightning here: inference reads these without it.
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer_nmt.conf import CONF_DIR
from transformer_nmt.data.config import DataConfig
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.metrics.catalog import MetricOptions
from transformer_nmt.model.transformer import TransformerConfig
from transformer_nmt.options import Role, declares_roles, option, show

TRAINING, EVALUATION, LENGTH, MAY_CHANGE, RUN = (Role.TRAINING, Role.EVALUATION, Role.LENGTH, Role.MAY_CHANGE,
                                               Role.RUN)  # each option's role (options.Role, training/roles.py)


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what to do."""

# The ``model`` node: TransformerConfig's fields but vocab_size, which the tokenizer sets at run time.
_model_types = typing.get_type_hints(TransformerConfig)
ModelConfig = dataclasses.make_dataclass(
    "ModelConfig", [(f.name, _model_types[f.name], field(default=f.default, metadata=f.metadata))
                    for f in fields(TransformerConfig) if f.name != "vocab_size"])
ModelConfig.__module__ = __name__
declares_roles(ModelConfig)
ModelConfig.__doc__ = ("The Transformer (``model.*``): TransformerConfig's fields and defaults (the paper's base "
                       "model) but vocab_size, which comes from the tokenizer (set data.vocab_size).")


@declares_roles
@dataclass
class TrainConfig:
    """Optimisation (paper 5.3, 5.4) and evaluation (``train.*``), paper values where it has one."""

    label_smoothing: float = option(0.1, "eps_ls: label smoothing of the loss (5.4)", role=TRAINING)
    lr_factor: float = option(1.0, "lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (5.3: 1.0)",
                              role=TRAINING)
    warmup_steps: int = option(4000, "optimizer steps of linear warmup, then inverse square root decay (5.3)",
                               role=TRAINING)
    lr: float | None = option(None, "the peak lr, at step warmup_steps, given directly (fairseq's --lr with "
                                     "--lr-scheduler inverse_sqrt): lr * min(step / warmup, (warmup / step)^0.5); "
                                     "null: from lr_factor and d_model as in 5.3", role=TRAINING)
    warmup_init_lr: float = option(0.0, "the lr the linear warmup starts from (fairseq's --warmup-init-lr); the "
                                        "paper's starts from 0", role=TRAINING)
    lr_schedule: str = option("inverse_sqrt", "after the warm-up: inverse_sqrt (5.3: decays with step^-0.5) | "
                                              "constant (the peak from then on; with warmup_steps=0 from the "
                                              "first step: a fine-tune's usual schedule)", role=TRAINING)
    betas: list[float] = option(help="Adam's (beta1, beta2) (5.3)", factory=lambda: [0.9, 0.98], role=TRAINING)
    eps: float = option(1e-9, "Adam's epsilon (5.3)", role=TRAINING)
    clip_grad_norm: float | None = option(None, "max global L2 norm of the gradients; null: no clipping (the "
                                                 "paper has none)", role=TRAINING)
    fused_adam: bool = option(True, "on CUDA, Adam(fused=True): one kernel updates every parameter", role=MAY_CHANGE)
    freeze: list[str] = option(help="parameter name patterns (fnmatch over named_parameters: encoder_layers.*, "
                                    "*norm*, decoder_layers.0.*) kept fixed: no gradient, no optimizer state; "
                                    "one that matches nothing is refused", factory=list, role=TRAINING)
    rdrop_alpha: float = option(0.0, "R-Drop (Liang et al. 2021; training/rdrop.py): each batch through the model "
                                     "twice (two dropout masks), the two cross-entropies plus this times the "
                                     "symmetric KL between the passes' token distributions; doubles the step's "
                                     "cost; 0: off", role=TRAINING)
    ema_decay: float | None = option(None, "an exponential moving average of the weights with this decay (e.g. "
                                            "0.999), updated after every optimizer step: what validation, the run's "
                                            "test and every checkpoint's decoding weights hold (the trained ones "
                                            "stay in the checkpoint for resume); null: none", role=TRAINING)
    ema_warmup: bool = option(True, "the average's decay ramps up as min(ema_decay, (1 + t) / (10 + t)) at "
                                    "optimizer step t; false: ema_decay from the first step", role=TRAINING)
    compile: bool = option(False, "torch.compile the model's forward (batch widths then a multiple of 8)",
                           role=TRAINING)
    val_bleu_max_sentences: int | None = option(500, "greedy BLEU (and train.val_metrics) on the validation split's "
                                                      "first N sentences; 0: none, null: all", role=EVALUATION)
    test_bleu_max_sentences: int | None = option(None, "the same for the test split", role=EVALUATION)
    val_metrics: list[str] = option(["bleu"], "the registered metrics (metrics/: bleu, chrf, ter, comet, ...) "
                                              "computed on those greedy translations, logged as val/NAME and "
                                              "test/NAME; checkpoint.monitor's metric is added", role=EVALUATION)


@declares_roles
@dataclass
class RecentCheckpointConfig:
    """A rolling window in checkpoints/recent/ for checkpoint averaging (paper 6.1: the last 5, written at
    10-minute intervals)."""

    keep: int = option(0, "the newest K; 0: off", role=RUN)
    every_n_train_steps: int | None = option(None, "one every N optimizer steps", role=RUN)
    every_n_minutes: float | None = option(None, "or one every M minutes of training; neither: one after every "
                                                  "validation", role=RUN)


@declares_roles
@dataclass
class CheckpointConfig:
    """What checkpoints/ keeps (``checkpoint.*``)."""

    save_top_k: int = option(3, "best-k by the monitored metric (checkpoint.monitor), plus last.ckpt", role=RUN)
    monitor: str = option("auto", "what best-k and early stopping rank by: val_NAME for any registered metric "
                                  "(val_bleu: greedy, detokenized sacreBLEU over train.val_bleu_max_sentences of the "
                                  "first validation set, with data.pairs the mean of the pairs'; val_comet, "
                                  "val_chrf, val_ter ...: in the metric's direction) | val_NAME/en-de (data.pairs: "
                                  "one pair's) | val_loss | auto: val_bleu, or val_loss when validation metrics are "
                                  "off", role=EVALUATION)
    patience: int | None = option(None, "stop after this many validations without a better monitored value "
                                         "(Lightning's EarlyStopping); null: never", role=EVALUATION)
    every_n_train_steps: int | None = option(None, "last.ckpt after every validation, and also every N optimizer "
                                                    "steps (mid-epoch resume)", role=RUN)
    recent: RecentCheckpointConfig = option(help="the averaging window", factory=RecentCheckpointConfig, role=RUN)


@declares_roles
@dataclass
class AttentionMapsConfig:
    """Per-head attention maps and entropies in TensorBoard (callbacks.AttentionMaps), on global rank 0: probes
    run on the training path, images render in a background thread; the cost of each is logged."""

    every_n_validations: int = option(1, "draw them every N validations; 0: off", role=RUN)
    n_probes: int = option(2, "default probes: the first n validation pairs (one image each per head)", role=RUN)
    probes: list[Any] | None = option(None, "or a list of [source, target] pairs / source strings", role=RUN)
    max_tokens: int = option(32, "probe sentences cut to this many tokens", role=RUN)
    per_pair: bool = option(False, "with data.pairs: maps for each pair under attention/PAIR/... (the first n_probes "
                                   "of its validation part, or the given probes in each direction); false: one "
                                   "group, each probe read with its own pair's tags", role=RUN)


# The roles of the Lightning Trainer's keyword arguments (``trainer.*``, a free dict): any other one defines
# training (trainer.limit_train_batches, trainer.overfit_batches, one Lightning adds), since a resume must not
# change what it does not know.
TRAINER_KEY_ROLES = {
    # held resolved by the run fingerprint: the precision it trains in; the tokens per optimizer step
    "precision": TRAINING, "accumulate_grad_batches": TRAINING,
    # where it runs (the world size is held in tokens_per_step), what it logs, shows and profiles
    "accelerator": RUN, "devices": RUN, "num_nodes": RUN, "strategy": RUN, "num_sanity_val_steps": RUN,
    "log_every_n_steps": RUN, "enable_progress_bar": RUN, "enable_model_summary": RUN, "enable_checkpointing": RUN,
    "default_root_dir": RUN, "profiler": RUN, "logger": RUN,
    # how long it trains: a finished run given more is resumed, not refused
    "max_epochs": LENGTH, "max_steps": LENGTH, "max_time": LENGTH,
    # how often and how much it validates and tests, and the least it trains before early stopping may stop it
    "min_epochs": EVALUATION, "min_steps": EVALUATION, "val_check_interval": EVALUATION,
    "check_val_every_n_epoch": EVALUATION, "limit_val_batches": EVALUATION, "limit_test_batches": EVALUATION,
}


@declares_roles
@dataclass
class TrainAppConfig:
    """conf/train.yaml: one training run (``python -m transformer_nmt.train``)."""

    name: str = option("default", "names the run directory: outputs/NAME/RUN_ID", role=RUN)
    run_id: str | None = option(None, "RUN_ID; null: slurm-SLURM_JOB_ID, torchrun-TORCHELASTIC_RUN_ID (--rdzv_id), "
                                       "torchrun-standalone-HASH (a hash of the run fingerprint) or the launch time "
                                       "(one process only): every rank and every requeue of a job share the dir",
                                role=RUN)
    sweep_id: str | None = option(None, "a sweep's directory, multirun/NAME/SWEEP_ID; null: the launch time. The "
                                         "same -m command with the same sweep_id skips the sweep's finished runs "
                                         "and resumes the others", role=RUN)
    seed: int = option(1234, "model init, dropout masks and, unless data.seed is set, batch order: a sweep axis "
                              "(-m ... seed=1,2,3); the vocabulary has its own (data.vocab_seed)", role=TRAINING)
    ckpt_path: str | None = option("auto", "auto: resume from the run dir's newest checkpoint (last.ckpt, "
                                            "hpc_ckpt_N.ckpt) if there is one, else start fresh; last: the same, "
                                            "but one must exist; null: fresh; a path", role=RUN)
    init_from: str | None = option(None, "a checkpoint to fine-tune (ours, or one python -m "
                                          "transformer_nmt.import_marian wrote): the run starts from its weights, "
                                          "architecture and tokenizer (model.* then sets only dropout, "
                                          "attention_dropout and the kernel; data.vocab_size is unused), with a "
                                          "fresh optimizer and schedule unless init_keep says otherwise", role=RUN)
    init_keep: list[str] = option(help="with init_from (a checkpoint of a training run): what else of its training "
                                       "the run continues, each on its own: optimizer (Adam's moments), schedule "
                                       "(the lr schedule's position), step (the optimizer step counter), data (the "
                                       "epoch and the place in it); [] (a fine-tune): none. Never the callbacks' "
                                       "state, the moving average or the run's identity (training/continuation.py)",
                                  factory=list, role=TRAINING)
    force_resume: bool = option(False, "ckpt_path=auto/last refuses a checkpoint written with other model, data, "
                                        "train or seed settings (fingerprint.py); true: resume it anyway", role=RUN)
    wait_for_run_dir: bool = option(False, "a run dir another launch holds (its .lock): false refuses, naming "
                                            "the holder's pid; true waits for it to end, then resumes what it left",
                                    role=RUN)
    run_test: bool = option(True, "after fit: test the best checkpoint (by val BLEU) on data.test", role=EVALUATION)
    validate_at_end: bool = option(False, "after fit, validate the final weights unless the last step was just "
                                           "validated (max_steps or max_time stopped the run between validations)",
                                   role=EVALUATION)
    run_dir: str | None = option(None, "not an option: the app sets it to the run's directory (hydra.run.dir), "
                                        "which callbacks and logger entries interpolate", role=RUN)
    model: ModelConfig = option(help="the Transformer (conf/model/)", factory=ModelConfig, role=TRAINING)
    data: DataConfig = option(help="the corpus, vocabulary and batches (conf/data/)", factory=DataConfig, role=TRAINING,
                              retired=["_target_"])  # the datamodule's class, in data configs until 2026-12
    train: TrainConfig = option(help="optimisation and evaluation", factory=TrainConfig, role=TRAINING)
    checkpoint: CheckpointConfig = option(help="checkpoints/", factory=CheckpointConfig, role=RUN)
    attention_maps: AttentionMapsConfig = option(help="attention maps in TensorBoard", factory=AttentionMapsConfig,
                                                 role=RUN)
    trainer: dict[str, Any] = option(help="keyword arguments of lightning.pytorch.Trainer (conf/trainer/)",
                                      factory=dict, role=TRAINING, keys=TRAINER_KEY_ROLES)
    callbacks: dict[str, Any] = option(help="NAME: {_target_: CLASS, ...} Lightning callbacks, built in order "
                                             "(conf/callbacks/); callbacks.NAME=null drops one", factory=dict,
                                       role=TRAINING)
    logger: dict[str, Any] | None = option(None, "{_target_: CLASS, ...}: the Lightning logger (conf/logger/)",
                                           role=RUN)
    decode: DecodeConfig = option(help="how this run's checkpoints are searched when scored after training "
                                       "(transformer_nmt.reproduce: beam, length_penalty, alpha); validation "
                                       "BLEU is greedy", factory=DecodeConfig, role=RUN)
    ablation: dict[str, Any] = option(help="free knobs an experiment interpolates into other settings "
                                            "(ablation.n_layers)", factory=dict, role=RUN)
    metric: MetricOptions = option(help="each metric's settings (metric.comet.model=DIR ...): metrics/; a directory "
                                        "on the machine that evaluates, in neither fingerprint",
                                   factory=MetricOptions, role=RUN)


@dataclass
class PrepareAppConfig:
    """conf/prepare.yaml: build the vocabulary and caches of a data config (``python -m transformer_nmt.prepare``)."""

    data: DataConfig = option(help="the corpus, vocabulary and batches (conf/data/)", factory=DataConfig)


def schema_error(cfg: DictConfig, schema: type = TrainAppConfig) -> str | None:
    """OmegaConf's error (naming the key) where ``cfg`` holds a key or a value the schema refuses, else None.
    Composing catches a typo in a YAML file or in KEY=VALUE, but not in +KEY=VALUE: Hydra adds those with the
    struct flag lifted, which lets a key past a schema too."""
    try:
        plain = OmegaConf.to_container(cfg)  # untyped, interpolations unresolved: the schema checks every key
        plain.pop("hydra", None)
        OmegaConf.merge(OmegaConf.structured(schema), plain)
    except OmegaConfBaseException as error:
        return str(error).splitlines()[0] + f" (full key: {error.full_key})"
    return None


# ------------------------------------------------------------------------------------------------ --help


def option_rows(schema: type, prefix: str = "") -> list[tuple[str, str]]:
    """(key=default, help) for every field of a dataclass schema, nested ones flattened to dotted keys; a
    dict field is one row, KEY.*."""
    rows = []
    for f in fields(schema):
        key, help = prefix + f.name, f.metadata.get("help", "")
        if "$" in help:
            raise ValueError(f"{key}: help text must not hold '$' (Hydra's help template would read it)")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            rows += option_rows(type(default), key + ".")
        elif isinstance(default, dict) or f.name == "logger":
            rows.append((f"{key}.*", help))
        else:
            rows.append((f"{key}={show(default)}", help))
    return rows


def options_help(schema: type, width: int = 118) -> str:
    """The options table of ``--help``: each option, its default and its help (wrapped), from the schema."""
    rows = [row for row in option_rows(schema) if not row[0].startswith("run_dir=")]
    column = min(40, max(len(key) for key, _ in rows)) + 4
    lines = []
    for key, help in rows:
        wrapped = textwrap.wrap(help, width - column) or [""]
        head = f"  {key:<{column - 2}}" if len(key) < column - 2 else f"  {key}\n{'':<{column}}"  # long keys: own line
        lines.append(head + wrapped[0])
        lines += [f"{'':<{column}}{line}" for line in wrapped[1:]]
    return "\n".join(lines)


def _help_node(app: str, schema: type, groups: str = "(schema: the defaults alone)\n$APP_CONFIG_GROUPS") -> dict:
    return {
        "app_name": f"transformer_nmt.{app}",
        "header": f"python -m transformer_nmt.{app} [GROUP=OPTION ...] [KEY=VALUE ...]\n{schema.__doc__}",
        "footer": "--cfg job prints the composed config (the groups' values); -m KEY=A,B sweeps. Powered by Hydra.",
        "template": ("${hydra.help.header}\n\n== Config groups (GROUP=OPTION) ==\n"
                     f"{groups}\n== Options (KEY=VALUE; the schema's defaults, which the groups and experiments "
                     "change) ==\n" + options_help(schema) + "\n\n${hydra.help.footer}\n"),
    }


def register_configs() -> None:
    """Put the schemas and the apps' --help into Hydra's ConfigStore. The apps call it before composing, and so
    must anything else that composes conf/train.yaml or conf/prepare.yaml (initialize_config_dir + compose)."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainAppConfig)
    store.store(name="prepare_schema", node=PrepareAppConfig)
    # The groups' own schemas, which their base files extend (model/base.yaml, data/local.yaml).
    store.store(group="model", name="schema", node=ModelConfig)
    store.store(group="data", name="schema", node=DataConfig)
    store.store(group="hydra/help", name="train_app", node=_help_node("train", TrainAppConfig))
    data_options = ", ".join(sorted(path.stem for path in (CONF_DIR / "data").glob("*.yaml")))
    store.store(group="hydra/help", name="prepare_app",
                node=_help_node("prepare", PrepareAppConfig, f"data: {data_options}\n"))
