"""The searches by name: how a batch of sources becomes hypotheses, chosen from the decoding settings.

Every strategy has one signature, ``strategy(model, batch, decode) -> per sentence its hypotheses, best first``:
``model`` a Transformer or anything with its decoding interface (an Ensemble), ``batch`` a ``SearchBatch`` (the
padded sources, forced prefixes, the special ids, each row's line number), ``decode`` the ``DecodeConfig``.
``STRATEGIES`` maps names to them and the settings' field ``strategy`` names one. Left at null, the older flags
still choose, as aliases (``strategy_name``): ``sample`` with ``sampling=true``, ``greedy`` at beam 1, else
``beam``; a ``strategy`` those flags contradict is an error naming both. A new search mode (diverse beam search)
is a new module with a function of that signature, registered here; a new rule applied at each step of every
search (n-gram blocking) is a processor (processors.py), one option field in config.py. Every search receives
the active processors (``active_processors``). Lexical constraints (``SearchBatch.constraints``) are honoured by
the beam, which hands the constrained sentences to constrained.py's beam (slots allocated by constraint
progress); greedy search and sampling refuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor

from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.constrained import constrained_beam
from transformer_nmt.generation.processors import active_processors
from transformer_nmt.generation.sampling import Sampler
from transformer_nmt.generation.search import Hypothesis, beam_search, greedy_search


@dataclass
class SearchBatch:
    """One batch to decode: ``src`` (B, S) right-padded source ids; ``prefix`` (B, P) forced first tokens (-1: free)
    or None; the tokenizer's ``bos_id`` and ``eos_id``; ``line_ids`` (B,): each row's line in the whole input
    (what seeds a sample, so that it does not depend on the batching); ``constraints``: per row the phrases (token
    id lists) its output must contain ([]: none), or None; ``word_continuations`` (V,) the tokens that continue a
    word, which may not follow a phrase (constrained.py), or None."""

    src: Tensor
    bos_id: int
    eos_id: int
    line_ids: list[int]
    prefix: Tensor | None = None
    constraints: list[list[list[int]]] | None = None
    word_continuations: Tensor | None = None


def greedy(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """The most likely token at each step: one hypothesis per sentence, score 0.0."""
    return [[h] for h in greedy_search(model, batch.src, bos_id=batch.bos_id, eos_id=batch.eos_id,
                                       max_len_offset=decode.max_len_offset, prefix=batch.prefix,
                                       processors=active_processors(decode))]


def sample(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Each token drawn from the model's distribution (``temperature``, ``top_k``, ``top_p``; seeded by ``seed``
    and the line): one hypothesis per sentence, score 0.0."""
    sampler = Sampler(batch.line_ids, decode.seed, decode.temperature, decode.top_k, decode.top_p,
                      batch.src.device)
    return [[h] for h in greedy_search(model, batch.src, bos_id=batch.bos_id, eos_id=batch.eos_id,
                                       max_len_offset=decode.max_len_offset, prefix=batch.prefix, choose=sampler,
                                       processors=active_processors(decode))]


def beam(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Beam search of width ``beam``: the ``n_best`` best hypotheses per sentence, scored with the length penalty;
    with constraints, those sentences that have some go to the constrained beam (constrained.py)."""
    if batch.constraints is not None and any(batch.constraints):
        return constrained_beam(model, batch, decode, beam)
    return beam_search(model, batch.src, bos_id=batch.bos_id, eos_id=batch.eos_id, beam_size=decode.beam,
                       alpha=decode.alpha, max_len_offset=decode.max_len_offset, n_best=decode.n_best,
                       prefix=batch.prefix, penalty=decode.length_penalty, processors=active_processors(decode))


Strategy = Callable[[object, SearchBatch, DecodeConfig], list[list[Hypothesis]]]
STRATEGIES: dict[str, Strategy] = {"greedy": greedy, "sample": sample, "beam": beam}
ONE_HYPOTHESIS = ("greedy", "sample")  # the strategies that give one output per sentence and take no constraints


def strategy_name(decode: DecodeConfig) -> str:
    """The strategy the settings name: ``strategy``, or, left at null, the older flags' (``sample`` with
    ``sampling=true``, ``greedy`` at beam 1, else ``beam``). A ValueError names the options that contradict."""
    name = decode.strategy
    if name is None:
        if decode.sampling:
            return "sample"
        return "greedy" if decode.beam == 1 else "beam"
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r}: use one of {', '.join(STRATEGIES)} (or null: from beam= and sampling=)")
    if decode.sampling and name != "sample":
        raise ValueError(f"sampling=true asks for strategy=sample, not strategy={name}: drop one of them")
    if name in ONE_HYPOTHESIS and decode.beam not in (1, DecodeConfig.beam):
        raise ValueError(f"strategy={name} keeps one hypothesis: drop beam={decode.beam}")
    return name


def generate(model, batch: SearchBatch, decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Decode ``batch`` with the strategy ``decode`` names."""
    name = strategy_name(decode)
    if name in ONE_HYPOTHESIS and batch.constraints is not None and any(batch.constraints):
        raise ValueError(f"constraints need a beam (strategy=beam, beam > 1): strategy {name} cannot honour them")
    return STRATEGIES[name](model, batch, decode)
