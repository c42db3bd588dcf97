"""Options declare their role (options.Role) in their schemas' field metadata, and the fingerprints' classification
is derived from it (training/roles.py): it must equal, exactly, the lists that training/fingerprint.py kept by hand
at commit bea1912, written out below as the independent reference; an option without a role is an error where
its class is defined."""

import dataclasses
import importlib
import sys

import pytest
from omegaconf import OmegaConf
from tiny_corpus import compose_train

from transformer_nmt.options import Role, declares_roles, option
from transformer_nmt.training import fingerprint, roles
from transformer_nmt.training.config import TrainAppConfig

# The hand-kept lists of training/fingerprint.py at bea1912 (lines 71-123), copied as data, with the options added
# since marked where they enter.
EVALUATION = ("data.val", "data.test", "data.eval_max_tokens", "train.val_bleu_max_sentences",
              "train.test_bleu_max_sentences",
              "train.val_metrics")  # added since: the registered metrics validation computes (issue 49, metrics/)
MAY_CHANGE = ("data.num_workers", "data.num_proc", "data.cache_dir", *EVALUATION,
              "model.attention", "model.attention_block_size", "train.fused_adam")
RETIRED = ("data._target_",)
TRAINER_NOT_RESULTS = ("accelerator", "devices", "num_nodes", "strategy", "precision", "accumulate_grad_batches",
                       "log_every_n_steps", "enable_progress_bar", "enable_model_summary", "num_sanity_val_steps",
                       "enable_checkpointing", "default_root_dir", "profiler", "logger")
RESULT_KEYS = ("run_test", "validate_at_end", "checkpoint.monitor", "checkpoint.patience")
EXTENDS = ("trainer.max_steps", "trainer.max_epochs", "trainer.max_time")
INIT_RUN_SETTINGS = ("dropout", "attention_dropout", "attention", "attention_block_size")
NOT_TRAINING = (
    "name", "run_id", "sweep_id", "run_dir", "ckpt_path", "force_resume", "wait_for_run_dir", "init_from",
    "run_test", "validate_at_end", "checkpoint", "decode", "logger", "attention_maps", "ablation",
    "metric",  # added since: the metrics' settings, metric.comet.model=DIR (issue 49, metrics/)
    "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy",
    "trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "trainer.min_epochs", "trainer.min_steps",
    "trainer.val_check_interval",
    "trainer.check_val_every_n_epoch", "trainer.limit_val_batches", "trainer.limit_test_batches",
    "trainer.num_sanity_val_steps", "trainer.log_every_n_steps", "trainer.enable_progress_bar",
    "trainer.enable_model_summary", "trainer.enable_checkpointing", "trainer.default_root_dir", "trainer.profiler",
    "trainer.logger",
    *MAY_CHANGE, *RETIRED)
DEFAULT_CALLBACKS = {
    "time_budget": "transformer_nmt.training.time_budget.TimeBudget",
    "best_checkpoint": "transformer_nmt.training.callbacks.best_checkpoint",
    "early_stopping": "transformer_nmt.training.callbacks.early_stopping",
    "recent_checkpoints": "transformer_nmt.training.callbacks.recent_checkpoints",
    "last_checkpoint": "transformer_nmt.training.callbacks.LastCheckpoint",
    "attention_maps": "transformer_nmt.training.callbacks.attention_maps",
    "progress_bar": "transformer_nmt.training.callbacks.progress_bar",
    "slurm_requeue": "transformer_nmt.training.slurm.SlurmRequeue",
}


@pytest.mark.parametrize("name, reference", [
    ("EVALUATION", EVALUATION), ("MAY_CHANGE", MAY_CHANGE), ("RETIRED", RETIRED),
    ("TRAINER_NOT_RESULTS", TRAINER_NOT_RESULTS), ("RESULT_KEYS", RESULT_KEYS), ("EXTENDS", EXTENDS),
    ("INIT_RUN_SETTINGS", INIT_RUN_SETTINGS), ("NOT_TRAINING", NOT_TRAINING)])
def test_the_derived_classification_equals_the_hand_kept_lists_of_bea1912(name, reference):
    derived = getattr(fingerprint, name)
    assert len(derived) == len(set(derived)) == len(reference), (name, derived)  # each key once, none missing
    assert set(derived) == set(reference), (name, sorted(set(derived) ^ set(reference)))


def test_the_default_callbacks_are_read_from_their_yaml_file():
    assert fingerprint.DEFAULT_CALLBACKS == DEFAULT_CALLBACKS


def test_every_key_of_a_composed_config_is_classified_as_before():
    """The run fingerprint's rule (a key below an entry of NOT_TRAINING is left out) over every key of a real config,
    with keys the schema does not declare (a free dict's, a retired one): the derived rule and the reference agree
    on each, and role_of says the same."""
    cfg = compose_train("data.train=a", "data.val=b", "data.test=c", "+trainer.limit_train_batches=3")
    keys = set(fingerprint._flatten(OmegaConf.to_container(cfg), "", {}))
    keys = {key[1:] for key in keys} | {"data._target_", "checkpoint.some_future_key", "trainer.overfit_batches",
                                         "callbacks.extra._target_", "seed", "unknown_top_level"}

    def reference_rule(key):
        return any(key == entry or key.startswith(entry + ".") for entry in NOT_TRAINING)

    assert len(keys) > 100
    for key in sorted(keys):
        assert fingerprint._not_training(key) == reference_rule(key), key
        if key not in RETIRED and not key.startswith(("callbacks.", "hydra.")):
            assert (roles.role_of(key) not in (None, Role.TRAINING)) == reference_rule(key), key


def test_defaulted_is_every_field_of_the_training_groups_and_the_runs_own_training_options():
    groups = {"model", "data", "train"}
    assert {key for key in fingerprint.DEFAULTED if key.split(".")[0] not in groups} == {"seed", "init_keep"}
    assert fingerprint.DEFAULTED["init_keep"] == [] and fingerprint.DEFAULTED["model.d_model"] == 512
    assert fingerprint.DEFAULTED["train.val_bleu_max_sentences"] == 500 and "data.train" not in fingerprint.DEFAULTED


def test_an_option_without_a_role_is_an_error_where_its_class_is_defined():
    with pytest.raises(TypeError, match=r"NewConfig: the option\(s\) new_knob declare no role"):
        @declares_roles
        @dataclasses.dataclass
        class NewConfig:
            lr: float = option(0.1, "declared", role=Role.TRAINING)
            new_knob: int = option(3, "a new option whose author forgot its role")


def test_a_schema_module_with_a_role_less_option_fails_to_import(tmp_path, monkeypatch):
    """As a contributor meets it: a module adding a training option without a role cannot be imported."""
    (tmp_path / "my_options.py").write_text(
        "import dataclasses\n"
        "from transformer_nmt.options import declares_roles, option\n"
        "from transformer_nmt.training.config import TrainConfig\n\n"
        "@declares_roles\n@dataclasses.dataclass\nclass MyTrainConfig(TrainConfig):\n"
        "    my_regularizer: float = option(0.0, 'a new loss term')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="my_regularizer declare no role"):
        importlib.import_module("my_options")
    sys.modules.pop("my_options", None)


def test_every_schema_below_the_app_declares_roles():
    """The groups whose fields are listed by role are the app's dataclass groups but decode (the search's settings,
    shared with translate and evaluate, one role as a group)."""
    declaring = {f.name for f in dataclasses.fields(TrainAppConfig) if roles._group_schema(f)}
    assert declaring == {"model", "data", "train", "checkpoint", "attention_maps"}
    assert roles.role_of("decode.beam") is Role.RUN and roles.role_of("checkpoint.recent.keep") is Role.RUN
    assert roles.role_of("model.attention") is Role.MAY_CHANGE and roles.role_of("trainer.max_steps") is Role.LENGTH


def test_the_summary_lists_the_options_set_by_role():
    cfg = compose_train("data.train=a", "data.val=b", "data.test=c", "model.d_model=64", "data.num_workers=1",
                        "checkpoint.patience=4", "decode.beam=5", "name=mine")
    found = roles.options_by_role(cfg)
    assert found[Role.TRAINING]["model.d_model"] == 64 and found[Role.TRAINING]["data.train"] == "a"
    assert found[Role.MAY_CHANGE] == {"data.num_workers": 1}
    assert found[Role.EVALUATION]["checkpoint.patience"] == 4 and found[Role.EVALUATION]["data.val"] == "b"
    assert found[Role.RUN]["decode.beam"] == 5 and found[Role.RUN]["name"] == "mine"
    assert not any(key.startswith(("trainer.", "callbacks.")) for values in found.values() for key in values)
    lines = roles.summary_lines(cfg)
    assert lines[0].startswith("options     defines training: ") and "model.d_model=64" in lines[0]
    assert [line.split(":")[0].split(None, 1)[1] for line in lines] == [
        "defines training", "evaluation-only", "may change on resume", "run management"]


def test_a_config_naming_a_default_callback_where_it_lived_before_is_the_same_run():
    """A config.yaml written before training/launch.py was split names SlurmRequeue there: the same run as today's
    (a finished sweep job's results rebuilt from it still match); another class under that name still counts."""
    cfg = compose_train("data.train=a", "data.val=b", "data.test=c")
    today = fingerprint.run_fingerprint(cfg)
    cfg.callbacks.slurm_requeue._target_ = "transformer_nmt.training.launch.SlurmRequeue"
    assert fingerprint.run_fingerprint(cfg) == today
    cfg.callbacks.slurm_requeue._target_ = "somewhere.else.SlurmRequeue"
    assert fingerprint.run_fingerprint(cfg)["callbacks.slurm_requeue._target_"] == "somewhere.else.SlurmRequeue"
