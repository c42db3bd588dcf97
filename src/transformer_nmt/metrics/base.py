"""What a metric is, and the registry that names them.

A metric scores a corpus of hypotheses against their references (and, where it ``needs_sources``, against the
sources too) and says what it measured: ``signature``, a sacreBLEU-style string of every setting that changes the
number, so that a number read later can be reproduced or refused as incomparable. It also says which way is better
(``higher_is_better``), which is what checkpoint selection and early stopping rank by.

A metric class registers itself with ``@register``; ``catalog.py`` imports every metric module in one list, which is
what makes them known. A metric with settings of its own (COMET's model directory) declares them as a dataclass,
``Options``: the commands expose them as ``metric.NAME.KEY=VALUE`` (catalog.MetricOptions).

Naming: a *metric* is one of these (evaluate's ``metrics=``, validation's ``val/NAME``); *scores* are the
log-probabilities of inference/scoring.py, never a metric's value.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Optional


@dataclass(frozen=True)
class MetricResult:
    """One corpus-level value of a metric: ``value`` (None where it could not be computed, ``signature`` then says
    why), its ``signature``, and ``details``: further numbers that belong to it (BLEU's length ratio and brevity
    penalty), each written beside the value under its own key."""

    value: Optional[float]
    signature: str
    details: dict = field(default_factory=dict)


class Metric(ABC):
    """A corpus-level metric. Subclasses set the class attributes and implement ``compute``; ``Options`` (a
    dataclass, or None) holds their settings, given to ``__init__``."""

    name: ClassVar[str]  # the key it is written under (evaluate's JSON, val/NAME in training)
    higher_is_better: ClassVar[bool]
    needs_sources: ClassVar[bool] = False
    Options: ClassVar[Optional[type]] = None  # a dataclass of its settings: metric.NAME.KEY=VALUE
    digits: ClassVar[int] = 2  # decimals of the value in a best checkpoint's file name (step0001000-bleu27.31)
    title: ClassVar[Optional[str]] = None  # its name in a table's header ("BLEU"); None: the name

    def __init__(self, options=None, tgt_lang: Optional[str] = None):
        self.options = options if options is not None or self.Options is None else self.Options()
        self.tgt_lang = tgt_lang  # the hypotheses' language, where a metric's tokenizer depends on it; None: unknown

    @abstractmethod
    def compute(self, hypotheses: list[str], references: list[str],
                sources: Optional[list[str]] = None) -> MetricResult:
        """The corpus value over parallel lists (``sources`` given where ``needs_sources``)."""

    @classmethod
    def heading(cls) -> str:
        """What a table's column calls it: ``title``, else the name."""
        return cls.title or cls.name

    def sentence_values(self, hypotheses: list[str], references: list[str],
                        sources: Optional[list[str]] = None) -> Optional[list[float]]:
        """One value per sentence whose mean is the corpus value, where the metric is such a mean (COMET); None
        where it is not (BLEU, chrF, TER: ratios of corpus-wide counts)."""
        return None

    def paired_bootstrap(self, baseline: list[str], systems: list[list[str]], references: list[str],
                         sources: Optional[list[str]] = None, resamples: int = 1000) -> Optional[list[float]]:
        """The p-value of each of ``systems`` against ``baseline`` (hypotheses of the same sentences) under a paired
        bootstrap (significance.py: sacreBLEU's test, the seed SACREBLEU_SEED), or None where the metric has no
        paired test. By default it resamples ``sentence_values``; the sacreBLEU metrics run sacreBLEU's own."""
        for hypotheses in (baseline, *systems):
            self.check_inputs(hypotheses, references, sources)
        values = self.sentence_values(baseline, references, sources)
        if values is None:
            return None
        from transformer_nmt.metrics.significance import paired_bootstrap_of_means

        return paired_bootstrap_of_means(values, [self.sentence_values(hyps, references, sources) for hyps in systems],
                                         resamples)

    def check(self) -> None:
        """A ValueError naming the option where the metric's settings cannot work (a missing model directory),
        raised before the work whose output it would score; nothing by default."""

    def check_inputs(self, hypotheses: list[str], references: list[str], sources: Optional[list[str]]) -> None:
        """A ValueError naming the metric where the lists do not line up, or the sources it needs are missing."""
        if len(hypotheses) != len(references):
            raise ValueError(f"metric {self.name}: {len(hypotheses)} hypotheses but {len(references)} references")
        if self.needs_sources:
            if sources is None:
                raise ValueError(f"metric {self.name} needs the source sentences, and none were given")
            if len(sources) != len(hypotheses):
                raise ValueError(f"metric {self.name}: {len(hypotheses)} hypotheses but {len(sources)} sources")


REGISTERED: dict[str, type[Metric]] = {}


def register(cls: type[Metric]) -> type[Metric]:
    """Class decorator: make ``cls`` known under ``cls.name``. A second class under one name is an error (two
    modules claiming one key of evaluate's JSON)."""
    for attribute in ("name", "higher_is_better"):
        if not hasattr(cls, attribute):
            raise TypeError(f"metric class {cls.__qualname__} does not set {attribute}")
    if not cls.name.isidentifier():  # it becomes a JSON key, an option key (metric.NAME) and val/NAME
        raise ValueError(f"metric name {cls.name!r} ({cls.__qualname__}): use letters, digits and underscores")
    if REGISTERED.get(cls.name, cls) is not cls:
        raise ValueError(f"metric {cls.name!r} is registered twice: {REGISTERED[cls.name].__qualname__} and "
                         f"{cls.__qualname__}")
    REGISTERED[cls.name] = cls
    return cls
