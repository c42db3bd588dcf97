"""The searches by name: how a batch of sources becomes hypotheses, chosen from the decoding settings.

Every strategy has one signature, ``strategy(model, batch, decode) -> per sentence its hypotheses, best first``:
``model`` a Transformer or anything with its decoding interface (an Ensemble), ``batch`` a ``SearchBatch`` (the
padded sources, forced prefixes, the special ids, each row's line number), ``decode`` the ``DecodeConfig``.
``STRATEGIES`` maps names to them and ``strategy_name`` picks one from the settings: ``sample`` with
``sampling=true``, ``greedy`` at beam 1, else ``beam``. A new mode (diverse beam search, constrained decoding) is
a new module with a function of that signature, registered here: the searches themselves stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor

from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.sampling import Sampler
from transformer_nmt.generation.search import Hypothesis, beam_search, greedy_search


@dataclass
class SearchBatch:
    """One batch to decode: ``src`` (B, S) right-padded source ids; ``prefix`` (B, P) forced first tokens (-1: free)
    or None; the tokenizer's ``bos_id`` and ``eos_id``; ``line_ids`` (B,): each row's line in the whole input
    (what seeds a sample, so that it does not depend on the batching)."""

    src: Tensor
    bos_id: int
    eos_id: int
    line_ids: list[int]
    prefix: Tensor | None = None


def greedy(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """The most likely token at each step: one hypothesis per sentence, score 0.0."""
    return [[h] for h in greedy_search(model, batch.src, bos_id=batch.bos_id, eos_id=batch.eos_id,
                                       max_len_offset=decode.max_len_offset, prefix=batch.prefix)]


def sample(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Each token drawn from the model's distribution (``temperature``, ``top_k``, ``top_p``; seeded by ``seed``
    and the line): one hypothesis per sentence, score 0.0."""
    sampler = Sampler(batch.line_ids, decode.seed, decode.temperature, decode.top_k, decode.top_p,
                      batch.src.device)
    return [[h] for h in greedy_search(model, batch.src, bos_id=batch.bos_id, eos_id=batch.eos_id,
                                       max_len_offset=decode.max_len_offset, prefix=batch.prefix, choose=sampler)]


def beam(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Beam search of width ``beam``: the ``n_best`` best hypotheses per sentence, scored with the length penalty."""
    return beam_search(model, batch.src, bos_id=batch.bos_id, eos_id=batch.eos_id, beam_size=decode.beam,
                       alpha=decode.alpha, max_len_offset=decode.max_len_offset, n_best=decode.n_best,
                       prefix=batch.prefix, penalty=decode.length_penalty)


Strategy = Callable[[object, SearchBatch, DecodeConfig], list[list[Hypothesis]]]
STRATEGIES: dict[str, Strategy] = {"greedy": greedy, "sample": sample, "beam": beam}


def strategy_name(decode: DecodeConfig) -> str:
    """The strategy the settings ask for: ``sample`` with ``sampling=true``, ``greedy`` at beam 1, else ``beam``."""
    if decode.sampling:
        return "sample"
    return "greedy" if decode.beam == 1 else "beam"


def generate(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Decode ``batch`` with the strategy ``decode`` names."""
    return STRATEGIES[strategy_name(decode)](model, batch, decode)
