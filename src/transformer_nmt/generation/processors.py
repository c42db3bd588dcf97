"""The per-step hook of every search: processors that rewrite a step's log-probabilities before a token is chosen.

Greedy search, sampling and beam search (search.py) and the constrained beam (constrained.py) all call, at each
step and before they choose, every active processor on that step's (n, V) float32 log-probabilities, where a row
is one live hypothesis: ``processor(log_probs, step) -> log_probs``, with ``step`` a ``Step``: the tokens each
row has generated so far, each row's sentence in the batch and the step's index. A processor may only lower
entries (-inf forbids a token); the searches then rank, sample and score what it returns, so a forbidden token is
never chosen by any of them. The shape is that of transformers' LogitsProcessor and fairseq2's StepProcessor:
one object per rule, called in order, knowing nothing of the search that calls it.

A processor is a decoding option: a field of ``generation.config.DecodeConfig`` made by ``processor_option``,
which names the class. That field is its one registration line: ``active_processors(decode)`` builds, from every
such field whose value is not its default, the class's ``from_option(value)``; translate, evaluate, synthesize
and the CTranslate2 engine (which refuses what it cannot honour, naming the option) read the same fields. With
no processor active the searches run exactly as before (the hook is skipped, not called with nothing to do).
"""

from __future__ import annotations

import importlib
from dataclasses import Field, dataclass, field, fields
from typing import Any, Protocol

from torch import Tensor


@dataclass
class Step:
    """What a processor may read about the rows of one step: ``tokens`` (n, t) the ids each row has generated so
    far (no bos; t = ``index``), ``sentences`` (n,) each row's sentence in the batch being decoded, ``index`` the
    step (0: the first token)."""

    tokens: Tensor
    sentences: Tensor
    index: int


class Processor(Protocol):
    """``(log_probs (n, V), step) -> (n, V)``: the step's log-probabilities with entries lowered (-inf: forbidden)."""

    def __call__(self, log_probs: Tensor, step: Step) -> Tensor: ...


def processor_option(processor: Any, default: Any, help: str):
    """A ``DecodeConfig`` field whose value, unless ``default``, switches on ``processor.from_option(value)``;
    ``processor`` is the class or its dotted path (``"transformer_nmt.generation.ngram_blocking.NoRepeatNGram"``),
    imported when the option is first switched on, so that the field is the processor's one registration line."""
    return field(default=default, metadata={"help": help, "processor": processor})


def processor_class(option: Field) -> Any:
    """The class a processor option names (its dotted path imported); an ImportError naming the option where the
    path leads nowhere."""
    processor = option.metadata["processor"]
    if not isinstance(processor, str):
        return processor
    module, _, name = processor.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"decode.{option.name}: its processor {processor!r} cannot be imported ({error})") from error


def processor_fields(decode) -> list:
    """The fields of ``decode``'s class that are processor options, in declaration order."""
    return [f for f in fields(decode) if "processor" in f.metadata]


def active_options(decode) -> list[str]:
    """``name=value`` of each processor option of ``decode`` that is not at its default (what an engine without the
    hook refuses, naming it)."""
    return [f"{f.name}={getattr(decode, f.name)}" for f in processor_fields(decode)
            if getattr(decode, f.name) != f.default]


def active_processors(decode) -> list[Processor]:
    """The processors ``decode`` switches on, in the order of its fields; [] when every one is at its default."""
    return [processor_class(f).from_option(getattr(decode, f.name)) for f in processor_fields(decode)
            if getattr(decode, f.name) != f.default]


def apply_processors(processors: list[Processor], log_probs: Tensor, step: Step) -> Tensor:
    """Each processor in turn on the step's (n, V) log-probabilities."""
    for processor in processors:
        log_probs = processor(log_probs, step)
    return log_probs
