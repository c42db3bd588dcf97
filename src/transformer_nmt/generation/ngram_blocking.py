"""n-gram blocking (``no_repeat_ngram=N``): no hypothesis contains the same N consecutive tokens twice.

A decoding processor (generation/processors.py): at each step, a row whose last N-1 generated tokens already
occurred followed by some token w may not emit w now, which would repeat that N-gram (the rule of fairseq's
``--no-repeat-ngram-size`` and transformers' ``no_repeat_ngram_size``; N=1: no token twice). Only generated tokens
count: bos is not one, and eos ends the hypothesis, so it never repeats. Vectorised over the rows: the row's
N-grams are its tokens' sliding windows, (n, t-N+1, N); those whose first N-1 tokens equal the row's last N-1
give the forbidden tokens. Cost: O(t * N) a row per step, nothing when the option is off.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_nmt.generation.processors import Step


class NoRepeatNGram:
    """Forbids the tokens that would complete an N-gram a row has already generated."""

    def __init__(self, n: int):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"no_repeat_ngram={n!r}: give the n-gram length, a whole number >= 1 (0: off)")
        self.n = n

    @classmethod
    def from_option(cls, value: int) -> NoRepeatNGram:
        return cls(value)

    def __call__(self, log_probs: Tensor, step: Step) -> Tensor:
        n, tokens = self.n, step.tokens  # tokens (rows, t)
        t = tokens.shape[1]
        if t < n:  # no complete n-gram yet besides the one being made
            return log_probs
        ngrams = tokens.unfold(1, n, 1)  # (rows, t-n+1, n)
        seen = (ngrams[:, :, : n - 1] == tokens[:, t - n + 1:].unsqueeze(1)).all(dim=-1)  # (rows, t-n+1)
        hits = torch.zeros_like(log_probs).scatter_add_(1, ngrams[:, :, -1], seen.to(log_probs.dtype))  # (rows, V)
        return log_probs.masked_fill(hits > 0, float("-inf"))
