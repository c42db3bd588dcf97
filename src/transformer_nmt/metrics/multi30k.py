"""BLEU in the convention the Multi30k literature reports: lowercased, on Moses-normalized and Moses-tokenized
text, so that our detokenized, cased sacreBLEU can be read next to the published numbers.

The WMT multimodal task and the text-only baselines on Multi30k score the dataset's ``lc.norm.tok`` files
(Moses' ``normalize-punctuation.perl`` and ``tokenizer.perl``, lowercased) with ``multi-bleu.perl``. Here both
sides go through sacremoses' ports of the two Moses scripts (``MosesPunctNormalizer``, then ``MosesTokenizer``
without aggressive hyphen splitting, XML escaping off: escaping maps tokens one to one and cannot change BLEU),
and sacreBLEU scores the result with ``tokenize="none"`` and ``lowercase=True`` (its ``-lc``). sacrebleu has no
Moses tokenizer of its own, so this needs the optional ``sacremoses`` (``pip install "transformer_nmt[compare]"``);
without it the fields are None and ``MISSING`` says why. Our references are tokenized from the raw files the same
way, not read from the dataset's own ``lc.norm.tok`` (not bundled): docs/quality.md says how far that is.
"""

from __future__ import annotations

import importlib.metadata
from typing import Optional

from sacrebleu.metrics import BLEU

from transformer_nmt.metrics.base import Metric, MetricResult, register

MISSING = "not computed: needs sacremoses (pip install \"transformer_nmt[compare]\")"


def moses_tokenized(lines: list[str], lang: str) -> list[str]:
    """Each line Moses-normalized (punctuation) and Moses-tokenized for ``lang``, tokens joined by spaces."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line), escape=False, return_str=True) for line in lines]


def multi30k_bleu(hypotheses: list[str], references: list[str], lang: str | None) -> dict:
    """``{"bleu_multi30k", "bleu_multi30k_signature"}``: sacreBLEU ``-lc``, ``tokenize="none"`` over both sides
    Moses-normalized and -tokenized for ``lang`` (the target language); None and the reason where ``lang`` is
    unknown or sacremoses is missing."""
    if lang is None:
        return {"bleu_multi30k": None, "bleu_multi30k_signature": "not computed: the target language is unknown"}
    try:
        version = importlib.metadata.version("sacremoses")
    except importlib.metadata.PackageNotFoundError:
        return {"bleu_multi30k": None, "bleu_multi30k_signature": MISSING}
    metric = BLEU(tokenize="none", lowercase=True, force=True)  # force: tokenized input is the point here
    result = metric.corpus_score(moses_tokenized(hypotheses, lang), [moses_tokenized(references, lang)])
    return {"bleu_multi30k": round(result.score, 4),
            "bleu_multi30k_signature": f"{metric.get_signature()}|moses:sacremoses-{version}-{lang}-norm-tok"}


@register
class Multi30kBleu(Metric):
    """``bleu_multi30k``: ``multi30k_bleu`` as a registered metric; the target language is ``tgt_lang`` (evaluate's
    ``lang=``, else the checkpoint's data.tgt_lang)."""

    name, higher_is_better = "bleu_multi30k", True

    def compute(self, hypotheses: list[str], references: list[str],
                sources: Optional[list[str]] = None) -> MetricResult:
        self.check_inputs(hypotheses, references, sources)
        result = multi30k_bleu(hypotheses, references, self.tgt_lang)
        return MetricResult(result["bleu_multi30k"], result["bleu_multi30k_signature"])
