"""How to decode: the one home of the search's settings (paper section 6.1: beam 4, length penalty 0.6, at most
source length + 50 tokens), of sampling's (off by default) and of the engine that runs it. translate, evaluate,
analyze_heads, explore, the validation BLEU of training, the CTranslate2 engine and the benchmarks all read their
defaults from here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from transformer_nmt.generation.processors import processor_option


@dataclass
class SearchConfig:
    """How to search, whichever engine runs it: what explore and analyze_heads take (they decode natively)."""

    beam: int = field(default=4, metadata={"help": "beam size; 1: greedy decoding"})
    alpha: float = field(default=0.6, metadata={"help": "length penalty exponent (of length_penalty's form)"})
    length_penalty: str = field(default="gnmt", metadata={
        "help": "gnmt: scores / ((5 + |Y|) / 6) ** alpha (the paper's) | power: scores / |Y| ** alpha (fairseq's "
                "--lenpen, CTranslate2's and transformers' length_penalty)"})
    max_len_offset: int = field(default=50, metadata={"help": "at most source length + this many tokens out"})
    max_tokens: int = field(default=4096, metadata={"help": "source tokens per batch, padding counted"})
    sampling: bool = field(default=False, metadata={
        "help": "true: sample each output token by token (temperature, top_k, top_p, seed) instead of searching"})
    temperature: float = field(default=1.0, metadata={"help": "sampling: divides the log-probabilities (< 1: "
                                                              "sharper)"})
    top_k: int = field(default=0, metadata={"help": "sampling: only from the k most likely tokens; 0: all"})
    top_p: float = field(default=1.0, metadata={
        "help": "sampling: only from the most likely tokens whose probability sums to top_p (nucleus); 1.0: all"})
    seed: int = field(default=0, metadata={"help": "sampling: with the line number, seeds each line's sample"})
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:1, ..."})


@dataclass
class EngineConfig:
    """What runs the search: torch, or CTranslate2 and its settings."""

    engine: str = field(default="native", metadata={"help": "native (torch) | ctranslate2 (pip install -e .[serve])"})
    compute_type: str = field(default="default", metadata={
        "help": "ctranslate2: default (as exported) | int8 | float32 | ... (quantized at load)"})
    threads: int = field(default=0, metadata={
        "help": "threads within each operation; 0: native: torch's default, ctranslate2: 1 per batch"})
    inter_threads: int = field(default=0, metadata={
        "help": "ctranslate2: batches decoded at once; 0: one per core"})


@dataclass
class DecodeConfig(EngineConfig, SearchConfig):
    """Every decoding setting: the search's, then the engine's. The commands' options are these dataclasses' own
    fields (translate, evaluate and synthesize extend DecodeConfig; explore and analyze_heads SearchConfig), so a
    new setting reaches every command that decodes without a line there. ``n_best``: the commands that write
    several hypotheses per input (translate, synthesize) and what scores them, not the analyses."""

    n_best: int = field(default=1, metadata={"help": "hypotheses per input, best first (<= beam)"})
    strategy: Optional[str] = field(default=None, metadata={
        "help": "the search: greedy | beam | sample (generation/strategies.py); null: as the older flags say "
                "(sampling=true: sample, beam=1: greedy, else beam); a choice the flags contradict is an error"})
    # Decoding processors (generation/processors.py): each field below is one processor's option and registration.
    no_repeat_ngram: int = processor_option("transformer_nmt.generation.ngram_blocking.NoRepeatNGram", 0,
                                            "no n-gram of this many tokens twice in an output; 0: off")


def decode_settings(decode: DecodeConfig | None = None, **changes) -> DecodeConfig:
    """``decode`` (by default ``DecodeConfig()``) with ``changes`` (``beam=1``, ...): what the translate functions
    run with, so that their callers name only what they change. An unknown name is a TypeError naming it."""
    return replace(decode or DecodeConfig(), **changes)
