"""The metrics the commands know: every metric module imported in one list (its ``@register`` classes become
known), and what evaluate, validation, checkpoint selection and the studies ask of them.

Adding a metric: a module in metrics/ with a ``@register``ed ``Metric`` subclass, and its name in the import line
below. Its settings (``Options``, a dataclass) appear as ``metric.NAME.KEY=VALUE`` in every command that takes
``metrics`` (``MetricOptions`` is built from the registry), and ``checkpoint.monitor=val_NAME`` selects checkpoints
on it with its direction.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from transformer_nmt.metrics import comet, multi30k, sacrebleu_metrics  # noqa: F401 (the registered metric modules)
from transformer_nmt.metrics.base import REGISTERED, Metric, MetricResult


def names() -> tuple[str, ...]:
    """Every registered metric's name, in the order of registration."""
    return tuple(REGISTERED)


def metric_class(name: str, option: str = "metrics") -> type[Metric]:
    """The class registered as ``name``; a ValueError naming ``option`` and the known names where none is."""
    if name not in REGISTERED:
        raise ValueError(f"{option}: no metric named {name!r}; the registered ones are {', '.join(REGISTERED)}")
    return REGISTERED[name]


def higher_is_better(name: str, option: str = "metrics") -> bool:
    return metric_class(name, option).higher_is_better


def mode(name: str, option: str = "metrics") -> str:
    """Lightning's ``mode`` for the metric ``name``: "max" where higher is better, else "min"."""
    return "max" if higher_is_better(name, option) else "min"


def _options_spec() -> type:
    """A dataclass with one field per metric that has settings (its ``Options``): ``metric.NAME.KEY=VALUE``."""
    fields = [(name, cls.Options, dataclasses.field(default_factory=cls.Options,
                                                    metadata={"help": f"settings of metric {name}"}))
              for name, cls in REGISTERED.items() if cls.Options is not None]
    spec = dataclasses.make_dataclass("MetricOptions", fields)
    spec.__module__ = __name__
    spec.__doc__ = "Each metric's settings, metric.NAME.KEY=VALUE (metrics/catalog.py)."
    return spec


MetricOptions = _options_spec()


def read_options(values) -> "MetricOptions":
    """A ``MetricOptions`` from plain values (a dict or an OmegaConf node of ``metric.*``; None: the defaults),
    typed and checked by OmegaConf (an unknown key is an error naming it)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(MetricOptions), values or {}))


def build(name: str, options=None, tgt_lang: Optional[str] = None, option: str = "metrics") -> Metric:
    """The metric ``name`` made with its part of ``options`` (a ``MetricOptions``, or None: the defaults), for
    hypotheses in ``tgt_lang``."""
    cls = metric_class(name, option)
    own = getattr(options, name, None) if options is not None else None
    return cls(own, tgt_lang=tgt_lang)


def check_names(metric_names, option: str = "metrics") -> list[str]:
    """``metric_names`` as a list, each one registered and none twice; a ValueError naming ``option`` otherwise."""
    metric_names = list(metric_names)
    for name in metric_names:
        metric_class(name, option)
    repeated = sorted({name for name in metric_names if metric_names.count(name) > 1})
    if repeated:
        raise ValueError(f"{option}: {', '.join(repeated)} named twice")
    return metric_names


def compute(metric_names, hypotheses: list[str], references: list[str], sources: Optional[list[str]] = None,
            options=None, tgt_lang: Optional[str] = None) -> dict[str, MetricResult]:
    """{name: MetricResult} for each of ``metric_names`` (checked first, before any is computed)."""
    metric_names = check_names(metric_names)
    built = [build(name, options, tgt_lang) for name in metric_names]
    return {metric.name: metric.compute(hypotheses, references, sources) for metric in built}


def best(items, value, name: str, option: str = "metrics"):
    """The item of ``items`` whose ``value(item)``, a value of the metric ``name``, is best in that metric's direction
    (the largest BLEU, the smallest TER); the first such item on a tie. Items whose value is None (a metric that
    could not be computed) are passed over; None where no item has a value."""
    scored = [item for item in items if value(item) is not None]
    if not scored:
        return None
    return (max if higher_is_better(name, option) else min)(scored, key=value)
