"""Sampling a translation token by token (back-translation, diverse outputs): temperature, top-k and top-p.

``Sampler`` is a ``choose`` rule of ``decoding.greedy_search``: at each step it draws each sentence's next token
from the model's distribution divided by the temperature, restricted to the ``top_k`` most likely tokens and to
the smallest set of them whose probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020). Each
sentence draws from its own generator, seeded from ``seed`` and the sentence's index in the input, so a
sentence's sample depends on neither the batch it is decoded in nor the sentences beside it.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor


def filter_log_probs(log_probs: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """(b, V) log-probabilities -> (b, V) logits of the distribution to sample: divided by ``temperature``,
    outside the ``top_k`` best (0: no limit) and outside the nucleus of mass ``top_p`` (1.0: no limit) -inf. The
    nucleus is the shortest run of the most likely tokens whose probability sums to at least ``top_p``."""
    logits = log_probs / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (b, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (b, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # (b, V) mass of the tokens more likely than each
        drop = before >= top_p  # the first token that reaches top_p stays; those after it go
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


class Sampler:
    """Draws the next token of each sentence; ``sentence_ids`` (B,): each row's index in the input, which seeds
    its generator together with ``seed``. Call as ``choose(log_probs (b, V), rows (b,), step) -> (b,)``."""

    def __init__(self, sentence_ids: list[int], seed: int, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, device: str | torch.device = "cpu"):
        check_sampling(temperature, top_k, top_p)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generators = [torch.Generator(device).manual_seed(sentence_seed(seed, i)) for i in sentence_ids]

    def __call__(self, log_probs: Tensor, rows: Tensor, step: int) -> Tensor:
        probs = torch.softmax(filter_log_probs(log_probs, self.temperature, self.top_k, self.top_p), dim=-1)
        return torch.cat([torch.multinomial(probs[r], 1, generator=self.generators[row])
                          for r, row in enumerate(rows.tolist())])  # (b,)


def sentence_seed(seed: int, index: int) -> int:
    """The seed of sentence ``index``'s generator: a hash of (seed, index), whatever the batching."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:8], "little") >> 1


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """A clear error for a value that cannot sample; names the option."""
    if not temperature > 0:
        raise ValueError(f"temperature={temperature}: must be > 0 (lower: closer to greedy)")
    if top_k < 0:
        raise ValueError(f"top_k={top_k}: must be >= 0 (0: no limit)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p}: must be in (0, 1] (1: no limit)")
