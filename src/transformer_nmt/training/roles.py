"""What each option of the training app is to a run, read from the role its field declares (``options.Role``),
so that the fingerprints (training/fingerprint.py), the resume check and the start-up summary follow the schemas
with no list of options kept anywhere else.

Every field of the app's schemas (TrainAppConfig and the groups below it: training/config.py, data/config.py,
model/transformer.py) declares a role, checked when the class is defined (``options.declares_roles``): a new option
without one is an import error, not a silent "defines training". A group's role covers the keys below it that its
schema does not declare (a free dict's entries, a key an older config held); a group whose class declares its
fields' roles (model, data, train, checkpoint) has them apply below it, one that does not (decode: the search's
settings, which translate and evaluate share) is one role throughout. A field's metadata may add ``keys``
(the roles of a free dict's known entries: trainer.*), ``retired`` (keys of the group that older configs hold but
that define nothing now) and ``run_setting`` (a model field that a fine-tune takes from the command, not from
init_from's checkpoint).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer_nmt.conf import CONF_DIR
from transformer_nmt.options import Role, show
from transformer_nmt.training.config import ModelConfig, TrainAppConfig

NOT_COMPARED = (Role.MAY_CHANGE, Role.RUN)  # in neither fingerprint
DEFAULT_CALLBACKS_FILE = CONF_DIR / "callbacks" / "default.yaml"


def _group_schema(field: dataclasses.Field) -> type | None:
    """The dataclass a group field holds, where that class declares its own fields' roles; else None."""
    factory = field.default_factory
    if isinstance(factory, type) and dataclasses.is_dataclass(factory) and vars(factory).get("__declares_roles__"):
        return factory
    return None


@cache
def declared(schema: type = TrainAppConfig, prefix: str = "") -> dict[str, Role]:
    """{dotted key: role} of every declared option of ``schema``, in declaration order: each field (a group's
    too), the fields of the groups whose classes declare roles, and the entries a field's ``keys`` names."""
    out: dict[str, Role] = {}
    for field in dataclasses.fields(schema):
        key = prefix + field.name
        out[key] = field.metadata["role"]
        out.update({f"{key}.{name}": role for name, role in field.metadata.get("keys", {}).items()})
        group = _group_schema(field)
        if group is not None:
            out.update(declared(group, key + "."))
    return out


def role_of(key: str, schema: type = TrainAppConfig) -> Role | None:
    """The role of dotted ``key``: its own declaration, else its nearest declared group's; None where nothing
    above it is declared (a top-level key the schema does not know: it counts as training)."""
    roles, parts = declared(schema), key.split(".")
    for end in range(len(parts), 0, -1):
        role = roles.get(".".join(parts[:end]))
        if role is not None:
            return role
    return None


def _parent_role(key: str) -> Role | None:
    return role_of(key.rpartition(".")[0]) if "." in key else None


def retired() -> tuple[str, ...]:
    """Keys older configs hold that define nothing now (each group field's ``retired``): ignored on both sides."""
    return tuple(f"{field.name}.{name}" for field in dataclasses.fields(TrainAppConfig)
                 for name in field.metadata.get("retired", ()))


def not_training() -> tuple[str, ...]:
    """The keys (and the groups below them) the run fingerprint leaves out: each declared key whose role does not
    define training where its group's does (or at the top), and the retired keys."""
    return tuple(key for key, role in declared().items()
                 if role is not Role.TRAINING and _parent_role(key) in (None, Role.TRAINING)) + retired()


def _fields_with(role: Role, in_training_group: bool) -> tuple[str, ...]:
    """The schema fields (not a free dict's entries) of ``role`` inside a group that defines training, or not."""
    keys = (key for key, r in declared().items() if r is role and not _free_dict_entry(key))
    return tuple(key for key in keys if (_parent_role(key) is Role.TRAINING) == in_training_group)


def _free_dict_entry(key: str) -> bool:
    group, _, name = key.rpartition(".")
    field = TrainAppConfig.__dataclass_fields__.get(group)
    return field is not None and name in field.metadata.get("keys", {})


def evaluation() -> tuple[str, ...]:
    """The evaluation-only options inside the groups that define training (data.val, train.val_bleu_max_sentences,
    ...): the results fingerprint holds them."""
    return _fields_with(Role.EVALUATION, in_training_group=True)


def result_keys() -> tuple[str, ...]:
    """The evaluation-only options outside those groups (run_test, checkpoint.monitor, ...): the results
    fingerprint holds them, and a finished run's config written before one existed is compared without it."""
    return _fields_with(Role.EVALUATION, in_training_group=False)


def may_change() -> tuple[str, ...]:
    """What a resume may change inside the groups that define training: how the same training is computed
    (``Role.MAY_CHANGE``) and what it is evaluated on (``evaluation``)."""
    return tuple(key for key, role in declared().items() if role is Role.MAY_CHANGE) + evaluation()


def trainer_keys(*roles: Role) -> tuple[str, ...]:
    """The Trainer's keyword arguments (``trainer.*``, without the prefix) declared with one of ``roles``."""
    return tuple(name for name, role in TrainAppConfig.__dataclass_fields__["trainer"].metadata["keys"].items()
                 if role in roles)


def extends() -> tuple[str, ...]:
    """The keys of ``Role.LENGTH``: a larger value trains longer (a finished run is extended, not refused)."""
    return tuple(key for key, role in declared().items() if role is Role.LENGTH)


def run_settings() -> tuple[str, ...]:
    """The model fields a fine-tune (init_from) takes from the command: ``run_setting`` in their metadata."""
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("run_setting"))


def default_callbacks() -> dict[str, str]:
    """{NAME: _target_} of conf/callbacks/default.yaml, the one place the default callbacks' classes are named."""
    entries = yaml.safe_load(DEFAULT_CALLBACKS_FILE.read_text(encoding="utf-8"))
    return {name: entry["_target_"] for name, entry in entries.items()}


def _default(field: dataclasses.Field) -> Any:
    """A field's default (a fresh one from its factory); ``MISSING`` where it has none (OmegaConf's ``???``: a
    value the user must give)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING if field.default == "???" else field.default


def training_defaults() -> dict[str, Any]:
    """{key: default} of every field of the groups that define training (model, data, train) and of every other
    top-level option that does (seed, init_keep), but the free dicts': what a fingerprint written before an option
    existed means by its absence (a new option defaults to what every run did before it)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(TrainAppConfig):
        if field.metadata["role"] is not Role.TRAINING or str(field.type).startswith("dict"):
            continue
        group = _group_schema(field)
        members = dataclasses.fields(group) if group is not None else [field]
        prefix = f"{field.name}." if group is not None else ""
        out.update({prefix + f.name: default for f in members if (default := _default(f)) is not dataclasses.MISSING})
    return out


# ------------------------------------------------------------------------------------------------ the summary


def _options(schema: type = TrainAppConfig, prefix: str = "", role: Role | None = None):
    """(dotted key, role) of every option that holds a value: the fields, but groups and free dicts, whose
    fields are given instead (a group whose class declares no roles, decode, with the group's role)."""
    for field in dataclasses.fields(schema):
        key, own = prefix + field.name, role or field.metadata["role"]
        factory = field.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            yield from _options(factory, key + ".", None if _group_schema(field) else own)
        elif not str(field.type).startswith("dict"):  # a free dict (trainer, callbacks, logger, ablation): not listed
            yield key, own


def options_by_role(cfg: DictConfig) -> dict[Role, dict[str, Any]]:
    """{role: {key: value}} of the options (the schemas' fields, not the free dicts': trainer, callbacks, logger,
    ablation) whose values in ``cfg`` differ from the schema's defaults: what the start-up summary lists, so that a
    run says which of its settings a resume must keep."""
    defaults = OmegaConf.structured(TrainAppConfig)
    out: dict[Role, dict[str, Any]] = {}
    for key, role in _options():
        value, default = _value(cfg, key), _value(defaults, key)
        if value != default:
            out.setdefault(role, {})[key] = value
    return out


def _value(cfg: DictConfig, key: str) -> Any:
    """``key``'s value in ``cfg``, resolved (None where it cannot be resolved outside Hydra)."""
    value = OmegaConf.select(cfg, key, throw_on_missing=False, throw_on_resolution_failure=False)
    if not OmegaConf.is_config(value):
        return value
    try:
        return OmegaConf.to_container(value, resolve=True)
    except OmegaConfBaseException:  # an interpolation inside it that only Hydra resolves: as written
        return OmegaConf.to_container(value)


def summary_lines(cfg: DictConfig, width: int = 12) -> list[str]:
    """The start-up summary's lines of the options set away from their defaults, one per role."""
    by_role = options_by_role(cfg)
    return [f"{'options':<{width}}{role.value}: " + ", ".join(f"{key}={show(value)}" for key, value in values.items())
            for role, values in ((r, by_role[r]) for r in Role if r in by_role)]
