"""The Multi30k literature's BLEU now lives in metrics/multi30k.py (a registered metric, ``bleu_multi30k``); this
module keeps its old import path."""

from transformer_nmt.metrics.multi30k import MISSING, moses_tokenized, multi30k_bleu

__all__ = ["MISSING", "moses_tokenized", "multi30k_bleu"]
