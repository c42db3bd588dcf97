"""key=value command-line options for the commands that are not Hydra apps (``translate``, ``evaluate``,
``average``, ``export``, ``analyze_heads``, ``explore``), in the language of the Hydra apps.

Each command declares its options as a dataclass: fields with defaults and ``metadata={"help": ...}``.
``parse_options`` reads argv with Hydra's own override parser, so ``key=value``, ``key=[0,3]`` (a list),
``key=null`` (None), ``key='4'`` (a string) mean what they mean for ``python -m transformer_nmt.train``, and merges
the values into ``OmegaConf.structured`` of the dataclass, which checks their types. An unknown key, a bad type,
a sweep (``a=1,2``) or a ``+``/``~`` override is an error naming the option; ``--help`` lists the options.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import sys
import textwrap
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import OverrideParseException
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

HELP_FLAGS = ("-h", "--help")
GRAMMAR = "Hydra's override grammar, as for train: key=[0,3] a list, key=null none, key='4' a string"
HELP_WIDTH = 120
HELP_KEY_WIDTH = 36  # the key=default column; a longer one gets a line of its own


class Role(enum.Enum):
    """What an option of the training app is to a run, declared in its field's metadata (``option(..., role=)``):
    training/roles.py derives from it what the run fingerprint holds (a resume refuses another value), what a
    finished run's results fingerprint adds, and the start-up summary. Two fingerprints, so four behaviours;
    ``MAY_CHANGE`` and ``RUN`` behave alike and say why."""

    TRAINING = "defines training"  # the run fingerprint holds it: a resume with another value is refused
    EVALUATION = "evaluation-only"  # what a finished run reports, not what trains: the results fingerprint alone
    LENGTH = "run length"  # how long it trains: the results fingerprint; a larger value extends a finished run
    MAY_CHANGE = "may change on resume"  # the same training computed otherwise (kernels, workers, caches): neither
    RUN = "run management"  # names, directories, devices, logging, checkpoints, the search: neither


def option(default: Any = MISSING, help: str = "", factory: Any = None, role: Role | None = None,
           **metadata: Any) -> Any:
    """A dataclass field with its default and help text (what ``--help`` prints); ``factory`` makes the default
    of a nested dataclass or a free dict; no default: required (OmegaConf's ``???``). ``role``: what the option
    is to a training run (``Role``; the training app's schemas must give one: ``declares_roles``); ``metadata``:
    more of the field's metadata (training/roles.py reads ``keys``, ``retired``, ``run_setting``)."""
    metadata = {"help": help, **({"role": role} if role is not None else {}), **metadata}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    if isinstance(default, (list, dict)):  # a mutable default: each instance gets its own copy
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declares_roles(schema: type) -> type:
    """Class decorator of the training app's schemas: every field of dataclass ``schema`` must declare its
    ``Role`` (``metadata["role"]``), so that a new option is an error where it is written, at import, rather
    than a silent "defines training". Returns ``schema``; a TypeError names each field without one."""
    missing = [f.name for f in dataclasses.fields(schema) if not isinstance(f.metadata.get("role"), Role)]
    if missing:
        raise TypeError(f"{schema.__module__}.{schema.__qualname__}: the option(s) {', '.join(missing)} declare no "
                        f"role: give each role=Role.X (options.Role: {', '.join(r.name for r in Role)}), which says "
                        f"whether a resume may change it and what a finished run's results depend on "
                        f"(docs/training.md, 'Options declare their role')")
    schema.__declares_roles__ = True
    return schema


def option_of(source: type, name: str, **change: Any) -> Any:
    """A field copied from dataclass ``source`` (its default and help, which live there alone); ``change``:
    ``default=`` or ``help=`` for this command."""
    field = source.__dataclass_fields__[name]
    return option(change.get("default", default_of(field)), change.get("help", field.metadata.get("help", "")),
                  role=field.metadata.get("role"))


def values_of(target: type, options: Any) -> Any:
    """An instance of dataclass ``target`` holding the values of ``options`` for the fields both have; the
    others keep ``target``'s defaults."""
    return target(**{f.name: getattr(options, f.name) for f in dataclasses.fields(target) if hasattr(options, f.name)})


def spec_from_dict(defaults: dict) -> type:
    """A dataclass for a plain {name: default} table (the scripts' OPTIONS): each field typed by its default's
    type, Any where the default is None or a list."""
    def typed(value):
        return Any if value is None or isinstance(value, (list, dict)) else type(value)
    return dataclasses.make_dataclass("Options", [(k, typed(v),
                                                   dataclasses.field(default_factory=lambda v=v: copy.deepcopy(v)))
                                                  for k, v in defaults.items()])


def show(value: Any) -> str:
    """A value as it is written on the command line (``???``: required, no default)."""
    if value is MISSING:
        return "???"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show(v) for v in value) + "]"
    return str(value)


def default_of(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def option_rows(spec: type, prefix: str = "") -> list[tuple[str, str]]:
    """(key=default, help) of every option of dataclass ``spec``, a nested dataclass's as dotted keys."""
    rows = []
    for f in dataclasses.fields(spec):
        default = default_of(f)
        if dataclasses.is_dataclass(default):
            rows += option_rows(type(default), f"{prefix}{f.name}.")
        else:
            rows.append((f"{prefix}{f.name}={show(default)}", f.metadata.get("help", "")))
    return rows


def help_text(spec: type, description: str | None = None, usage: str | None = None) -> str:
    """What ``--help`` prints: usage, the description's first paragraph, every option with default and help."""
    rows = option_rows(spec)
    width = min(HELP_KEY_WIDTH, max(len(key) for key, _ in rows)) + 2
    lines = [f"usage: {usage}", ""] if usage else []
    if description:
        lines += [textwrap.fill(description.strip().split("\n\n")[0], HELP_WIDTH), ""]
    lines.append(f"options, key=value ({GRAMMAR}):")
    for key, help in rows:
        if len(key) + 2 > width:  # a long key (a list default) on a line of its own, its help below
            lines.append(f"  {key}")
            key = ""
        lines.append(textwrap.fill(help, HELP_WIDTH, subsequent_indent=" " * (2 + width),
                                   initial_indent=f"  {key:<{width}}"))
    return "\n".join(lines)


def option_error(spec: type, message: str) -> SystemExit:
    return SystemExit(f"{message}\nknown options: {', '.join(f.name for f in dataclasses.fields(spec))} "
                      f"(--help lists them with their defaults)")


def parse_options(argv: list[str], spec: type | dict, description: str | None = None,
                  usage: str | None = None) -> Any:
    """argv (``key=value`` words) over the options of dataclass ``spec``: an instance of it. ``-h``/``--help``
    prints ``help_text`` and exits 0. A plain dict of defaults (a script's OPTIONS) is read the same way and
    gives a dict."""
    if isinstance(spec, dict):
        return dataclasses.asdict(parse_options(argv, spec_from_dict(spec), description, usage))
    if any(arg in HELP_FLAGS for arg in argv):
        print(help_text(spec, description, usage))
        raise SystemExit(0)
    config = OmegaConf.structured(spec)
    parser = OverridesParser.create()
    for arg in argv:
        try:
            (override,) = parser.parse_overrides([arg])
        except OverrideParseException as error:
            raise option_error(spec, f"{arg!r} is not key=value ({GRAMMAR}): {str(error).splitlines()[0]}") from None
        key = override.key_or_group
        if override.is_sweep_override():
            raise option_error(spec, f"{arg}: a sweep (several runs, Hydra's -m) is not an option value; a list is "
                                     f"written {key}=[a,b]")
        if override.type != OverrideType.CHANGE or override.package is not None:
            raise option_error(spec, f"{arg}: give key=value (these options are fixed: no +, ++, ~ or @)")
        try:
            OmegaConf.update(config, key, override.value(), merge=True)
        except (ConfigAttributeError, ConfigKeyError):
            raise option_error(spec, f"unknown option {key!r} (in {arg})") from None
        except ValidationError as error:
            field = spec.__dataclass_fields__.get(key.split(".")[0])
            expected = f"; {key} is {field.type} (default {show(default_of(field))})" if field else ""
            raise option_error(spec, f"{arg}: {str(error).splitlines()[0].rstrip('.')}{expected}") from None
    return OmegaConf.to_object(config)


def require_checkpoint(options: Any) -> None:
    """A missing ``ckpt`` (or ``model_dir``, where the command takes one) is an error saying what to give."""
    if getattr(options, "ckpt", None) or getattr(options, "model_dir", None):
        return
    alternative = (" or model_dir=DIR (written by python -m transformer_nmt.export)" if hasattr(options, "model_dir")
                   else "")
    raise SystemExit(f"missing ckpt=PATH (a checkpoint written by python -m transformer_nmt.train){alternative}")


def command_argv(argv: list[str] | None) -> list[str]:
    """The command's arguments: ``argv`` when called from Python, else the command line's."""
    return sys.argv[1:] if argv is None else argv

