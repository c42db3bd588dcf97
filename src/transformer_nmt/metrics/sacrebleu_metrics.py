"""sacreBLEU's corpus metrics, detokenized and scored as written: BLEU (cased and lowercased), chrF, chrF++ and TER,
each with sacreBLEU's own signature, so that ``sacrebleu REF -i HYP -m ...`` reproduces the number exactly."""

from __future__ import annotations

import math
from typing import Optional

from sacrebleu.metrics import BLEU, CHRF, TER

from transformer_nmt.metrics.base import Metric, MetricResult, register
from transformer_nmt.metrics.significance import sacrebleu_paired_bootstrap


class SacreBLEUMetric(Metric):
    """One sacreBLEU metric object, made by ``make`` (its settings are the metric's, fixed per name)."""

    def make(self):
        raise NotImplementedError

    def compute(self, hypotheses: list[str], references: list[str],
                sources: Optional[list[str]] = None) -> MetricResult:
        self.check_inputs(hypotheses, references, sources)
        metric = self.make()
        result = metric.corpus_score(hypotheses, [references])
        return MetricResult(result.score, str(metric.get_signature()), self.details(result))

    def details(self, result) -> dict:
        return {}

    def paired_bootstrap(self, baseline: list[str], systems: list[list[str]], references: list[str],
                         sources: Optional[list[str]] = None, resamples: int = 1000) -> list[float]:
        """sacreBLEU's own paired bootstrap (significance.sacrebleu_paired_bootstrap) of this metric."""
        for hypotheses in (baseline, *systems):
            self.check_inputs(hypotheses, references, sources)
        return sacrebleu_paired_bootstrap(self.make(), baseline, systems, references, resamples)


@register
class Bleu(SacreBLEUMetric):
    """sacreBLEU's BLEU (13a tokenizer, cased); beside it the length ratio (hypothesis / reference tokens) and the
    brevity penalty."""

    name, higher_is_better = "bleu", True
    title = "BLEU"

    def make(self):
        return BLEU()

    def details(self, result) -> dict:
        ratio = result.sys_len / result.ref_len if result.ref_len else math.nan  # every reference blank: undefined
        return {"length_ratio": ratio, "bp": result.bp}


@register
class BleuLowercase(SacreBLEUMetric):
    """sacreBLEU's BLEU on lowercased text (``-lc``)."""

    name, higher_is_better = "bleu_lowercase", True
    title = "BLEU lc"

    def make(self):
        return BLEU(lowercase=True)


@register
class Chrf(SacreBLEUMetric):
    """chrF (Popović 2015): character n-gram F-score, beta 2."""

    name, higher_is_better = "chrf", True
    title = "chrF"

    def make(self):
        return CHRF()


@register
class ChrfPlusPlus(SacreBLEUMetric):
    """chrF++ (Popović 2017): chrF with word unigrams and bigrams (sacreBLEU's ``word_order=2``)."""

    name, higher_is_better = "chrfpp", True
    title = "chrF++"

    def make(self):
        return CHRF(word_order=2)


@register
class Ter(SacreBLEUMetric):
    """TER (Snover et al. 2006): edits per reference word, in percent; lower is better."""

    name, higher_is_better = "ter", False
    title = "TER"

    def make(self):
        return TER()
