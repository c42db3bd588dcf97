"""A settings dataclass rebuilt from a record another process wrote (a checkpoint's model or data config, an
export's ``transformer_nmt.json``): data, never code.

``from_record`` checks the record's keys against the dataclass's fields and each value against its field's
type (plain scalars, ``None`` where allowed, lists of them) before calling the dataclass: a key it does not know
is named with the version that wrote the record; a value of another type (a nested mapping such as
``{"_target_": ...}`` where a path belongs) is named and refused. Nothing in a record is imported, called or
instantiated; Hydra's ``_target_`` keys are not options of any of these dataclasses.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from transformer_nmt import __version__

T = TypeVar("T")


class RecordError(ValueError):
    """A record (config inside a checkpoint or export) this version cannot read; the message names the file,
    the key and the version."""


def writer(version: str | None) -> str:
    """Who wrote a record, for messages: its transformer_nmt version, or that it recorded none."""
    return f"transformer_nmt {version}" if version else "a transformer_nmt version that did not record itself"


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of type ``hint`` (int, float, str, bool, None, X | None, list[X], tuple[X, ...])."""
    if hint is Any:  # a field OmegaConf cannot type as a union (data.val: a split or a list of them)
        scalar = (str, int, float, bool)
        return (value is None or isinstance(value, scalar)
                or isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value))
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_matches(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin in (list, tuple):
        (item, *_) = typing.get_args(hint) or (Any,)
        return isinstance(value, (list, tuple)) and all(_matches(v, item) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return False  # a type no record field should have: refuse rather than guess


def from_record(cls: type[T], record: Any, source: str, what: str, version: str | None = None) -> T:
    """``cls(**record)`` once every key is a field of ``cls`` and every value of its field's type, else
    ``RecordError`` naming ``source`` (the file), ``what`` (e.g. ``model_config``), the key and ``version`` (the
    transformer_nmt version that wrote the record, None: not recorded). Errors of ``cls`` itself (a value out of
    range) come back as ``RecordError`` naming ``source``."""
    if not isinstance(record, Mapping):
        raise RecordError(f"{source}: {what} is a {type(record).__name__}, not a mapping of settings")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(key) for key in record if key not in known)
    if unknown:
        raise RecordError(f"{source}: {what} has fields this transformer_nmt ({__version__}) does not know: {unknown} "
                          f"(written by {writer(version)}); read it with the version that wrote it, or a newer one. "
                          f"Known fields: {sorted(known)}")
    for key, value in record.items():
        if not _matches(value, hints[key]):
            raise RecordError(f"{source}: {what}.{key} is {value!r:.120}, not a {hints[key]} (written by "
                              f"{writer(version)}); the file is damaged or was not written by transformer_nmt")
    try:
        return cls(**record)
    except (TypeError, ValueError) as error:  # a required field missing, a value out of range
        raise RecordError(f"{source}: {what}: {error} (written by {writer(version)})") from None
