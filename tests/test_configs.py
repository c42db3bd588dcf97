"""The structured configs: every option's default and help lives in a dataclass (training/config.py,
data/config.py, TransformerConfig), the YAML files are diffs over them, unknown keys fail at compose time,
callbacks and the logger are ``_target_`` entries, ``--help`` lists the options, and a checkpoint's data config
is read as data options, never instantiated."""

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import OmegaConf
from tiny_corpus import write_tiny_corpus

from transformer_nmt.conf import CONF_DIR
from transformer_nmt.data.config import DataConfig
from transformer_nmt.inference.evaluate import split_pairs
from transformer_nmt.training.app import ConfigError, build_callbacks, build_trainer
from transformer_nmt.training.callbacks import AttentionMaps, LastCheckpoint, RecordFingerprint, TokenProgressBar
from transformer_nmt.training.config import ModelConfig, PrepareAppConfig, TrainAppConfig, option_rows, register_configs
from transformer_nmt.training.slurm import SlurmRequeue
from transformer_nmt.training.time_budget import TimeBudget

REPO = Path(__file__).resolve().parents[1]
OLD_TARGET = "transformer_nmt.datamodule.TranslationDataModule"  # the data config's _target_ before 2026-12


def compose_train(*overrides: str, config_dir: Path = CONF_DIR):
    register_configs()
    with initialize_config_dir(str(config_dir), version_base="1.3"):
        return compose("train", overrides=list(overrides))


# --- one home for every default ----------------------------------------------------------------------------------


@pytest.mark.parametrize("schema", [TrainAppConfig, PrepareAppConfig])
def test_every_option_has_a_help_text(schema):
    rows = option_rows(schema)
    assert len(rows) > 60 if schema is TrainAppConfig else len(rows) == len(dataclasses.fields(DataConfig))
    assert all(help for _, help in rows), [key for key, help in rows if not help]


def test_the_yaml_files_repeat_no_default_of_the_schemas():
    """model/base.yaml and data/local.yaml extend their schemas with nothing; train.yaml sets no option."""
    for group, base in (("model", "base"), ("data", "local")):
        assert set(OmegaConf.load(CONF_DIR / group / f"{base}.yaml")) == {"defaults"}, group
    assert set(OmegaConf.load(CONF_DIR / "train.yaml")) == {"defaults", "hydra"}
    base = compose_train("model=base").model
    assert OmegaConf.get_type(base) is ModelConfig
    assert OmegaConf.to_container(base) == dataclasses.asdict(ModelConfig())
    assert "vocab_size" not in base  # the tokenizer's, at run time
    small = OmegaConf.load(CONF_DIR / "model" / "small.yaml")  # a diff: only what differs from the schema
    assert all(small[key] != getattr(ModelConfig(), key) for key in small if key != "defaults")


def test_a_typo_in_a_yaml_file_fails_at_compose_with_the_key_named(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, ignore=shutil.ignore_patterns("__pycache__"))
    (conf / "model" / "typo.yaml").write_text("defaults:\n  - base\n  - _self_\nd_models: 64\n")
    (conf / "experiment" / "typo.yaml").write_text("# @package _global_\ncheckpoint:\n  save_topk: 2\n")
    with pytest.raises(Exception, match="Key 'd_models' not in 'ModelConfig'"):
        compose_train("model=typo", config_dir=conf)
    with pytest.raises(Exception, match="Key 'save_topk' not in 'CheckpointConfig'"):
        compose_train("experiment=typo", config_dir=conf)
    with pytest.raises(Exception, match="train.warmup_steps"):  # the types are checked too
        compose_train("train.warmup_steps=soon")
    assert compose_train("trainer.max_time=00:01:00:00").trainer.max_time == "00:01:00:00"  # trainer: a free dict


# --- callbacks and logger from _target_ entries ------------------------------------------------------------------


def built(tmp_path, *overrides):
    cfg = compose_train(*overrides)
    cfg.run_dir = str(tmp_path)
    return cfg, build_callbacks(cfg, ["seed=1"])


def test_callbacks_are_built_in_the_order_of_their_config(tmp_path):
    cfg, callbacks = built(tmp_path)
    assert [type(c) for c in callbacks] == [RecordFingerprint, TimeBudget, ModelCheckpoint, LastCheckpoint,
                                            AttentionMaps, TokenProgressBar, SlurmRequeue]
    best = callbacks[2]
    assert (best.dirpath, best.monitor, best.save_top_k) == (str(tmp_path / "checkpoints"), "val/bleu", 3)
    assert callbacks[3].path == tmp_path / "checkpoints" / "last.ckpt"
    cfg, callbacks = built(tmp_path, "checkpoint.recent.keep=4", "checkpoint.recent.every_n_minutes=10",
                           "train.val_bleu_max_sentences=0", "attention_maps.every_n_validations=0",
                           "trainer.enable_progress_bar=false", "callbacks.time_budget=null",
                           "+callbacks.lr_monitor._target_=lightning.pytorch.callbacks.LearningRateMonitor")
    assert [type(c) for c in callbacks] == [RecordFingerprint, ModelCheckpoint, ModelCheckpoint, LastCheckpoint,
                                            SlurmRequeue, LearningRateMonitor]
    best, recent = callbacks[1:3]
    assert (best.monitor, best.mode) == ("val/loss", "min")  # BLEU off: the loss ranks them
    assert (recent.dirpath, recent.save_top_k) == (str(tmp_path / "checkpoints" / "recent"), 4)


def test_last_checkpoint_must_come_after_every_model_checkpoint(tmp_path):
    moved = ["callbacks.last_checkpoint=null", "+callbacks.last._target_=transformer_nmt.training.callbacks."
             "LastCheckpoint", f"+callbacks.last.dirpath={tmp_path}", "+callbacks.late._target_=transformer_nmt."
             "training.callbacks.best_checkpoint", f"+callbacks.late.dirpath={tmp_path}/late",
             "+callbacks.late.save_top_k=1", "+callbacks.late.val_bleu_max_sentences=0"]
    with pytest.raises(ConfigError, match="LastCheckpoint entry must come after every ModelCheckpoint"):
        built(tmp_path, *moved)


def test_the_logger_is_its_config(tmp_path):
    cfg, callbacks = built(tmp_path, "trainer.precision=32-true")
    trainer = build_trainer(cfg, tmp_path, callbacks)
    assert Path(trainer.logger.log_dir) == tmp_path / "tensorboard"
    cfg, callbacks = built(tmp_path, "trainer.precision=32-true", "~logger")  # no logger
    assert build_trainer(cfg, tmp_path, callbacks).logger is None


# --- --help ------------------------------------------------------------------------------------------------------


def command_help(monkeypatch, capsys, command) -> str:
    """What ``python -m transformer_nmt.NAME --help`` prints, run in this process (the command's own entry point
    under Hydra: importing it is most of a subprocess's cost, and this worker has imported it already)."""
    from hydra.core.global_hydra import GlobalHydra

    monkeypatch.setattr(sys, "argv", [command.__name__, "--help"])
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as exit_:
            command.main()
    finally:
        GlobalHydra.instance().clear()  # Hydra leaves its state behind where --help exits
    assert exit_.value.code in (0, None)
    return capsys.readouterr().out


def test_help_lists_every_option_with_its_default_and_help(monkeypatch, capsys):
    import transformer_nmt.prepare
    import transformer_nmt.train

    train = command_help(monkeypatch, capsys, transformer_nmt.train)
    words = " ".join(train.split())  # the table wraps help texts
    for key, help in option_rows(TrainAppConfig):
        if not key.startswith("run_dir="):  # set by the app, not an option
            assert f" {key} {help[:40]}".rstrip() in words, key
    assert "  model.d_model=512 " in train and " model width\n" in train
    assert "experiment: " in train and "smoke" in train  # the groups and their options
    prepare = command_help(monkeypatch, capsys, transformer_nmt.prepare)
    assert "data.vocab_size=8000" in prepare and "data.train=???" in prepare
    assert "train.warmup_steps" not in prepare


# --- a checkpoint's data config: data options, never code --------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"), n_train=4, n_eval=3)


def record(corpus, **extra) -> dict:
    """A data config as a checkpoint holds it: every option, resolved."""
    options = dataclasses.asdict(DataConfig(train=f"{corpus}/train", val=f"{corpus}/val", test=f"{corpus}/test"))
    return {**options, **extra}


@pytest.mark.parametrize("target", [None, OLD_TARGET, "transformer_nmt.data.datamodule.TranslationDataModule"])
def test_a_checkpoints_data_config_of_any_layout_reads_its_split(corpus, target):
    data_config = record(corpus) if target is None else record(corpus, _target_=target)
    sources, references = split_pairs({"path": "run/last.ckpt", "data_config": data_config}, "val",
                                      trust_paths=True)  # the corpus is a temporary directory
    assert sources == (corpus / "val.en").read_text().splitlines() and len(references) == 3


def test_a_checkpoint_naming_other_code_is_refused_and_runs_nothing(corpus, tmp_path):
    victim, absent = tmp_path / "victim.txt", tmp_path / "created.txt"
    victim.write_text("keep me\n")
    for path in (victim, absent):  # hydra.utils.instantiate would open (create, truncate) the file
        meta = {"path": "bad.ckpt", "data_config": {"_target_": "builtins.open", "file": str(path), "mode": "w"}}
        with pytest.raises(SystemExit, match=r"checkpoint bad.ckpt: data_config._target_='builtins.open'"):
            split_pairs(meta, "val")
    assert victim.read_text() == "keep me\n" and not absent.exists()
    meta = {"path": "odd.ckpt", "data_config": record(corpus, _target_=OLD_TARGET, loader="x")}
    with pytest.raises(SystemExit, match=r"checkpoint odd.ckpt: data_config has fields this transformer_nmt .* does "
                                         r"not know: \['loader'\]"):
        split_pairs(meta, "val")
