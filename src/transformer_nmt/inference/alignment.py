"""Word alignments from cross-attention, as fairseq's ``--print-alignment hard|soft`` prints them.

A target piece is aligned through the cross-attention of one decoder query: with ``position="output"``
(the default, as fairseq) the query that *predicts* the piece, with ``position="input"`` the query whose
*input* is the piece (the shifted position, which predicts the next piece). Shift-Att (Chen et al. 2020)
finds the input position aligns better in large NMT models; on the permutation task of
transformer_nmt.alignment_aer, where the truth is known, the output position is right (AER <= 0.01) and the
input position wrong (AER ~0.9), so output is the default. The weights are averaged over ``heads``
(default: all) of decoder layer ``layer`` (default: the last, -1).

Pieces are merged into words, the whitespace-separated words of the text the pieces spell: for the source,
the input line (pieces as encoded, "▁" a space; an unknown character stays inside its word), for the target,
the printed translation (each piece's text in ``tokenizer.decode``'s output, where an unknown piece is " ⁇ ",
a word of its own, and a special id is no text). A piece belongs to the word of its first visible character;
a piece with none ("▁" alone) to the next piece's word. A source word's weight is the sum over its pieces (the
mass the query puts on the word), a target word's row is the mean over its pieces' rows. The source eos is
dropped and each row renormalised over the source words, so soft rows sum to 1. Hard alignments give
each target word the source word of largest weight.

Lines, beside each translation: hard ``i-j`` pairs (source word i, target word j, both from 0, in
target order), soft ``w_0,w_1,...`` per target word (its weights over the source words), one group per
target word, separated by spaces. Quality is measured with AER (``alignment_error_rate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import Tensor

from transformer_nmt.inference.attention_weights import teacher_forced_attention
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.options import option

ALIGNMENT_MODES = ("hard", "soft")
ALIGNMENT_POSITIONS = ("output", "input")


@dataclass
class AlignmentOptions:
    """The cross-attention that ``print_alignment`` reads: the one home of these options' defaults."""

    alignment_layer: int = option(-1, "decoder layer whose cross-attention aligns; -1: the last")
    alignment_heads: Optional[List[int]] = option(None, "heads to average, e.g. [0,3]; null: all")
    alignment_position: str = option("output", "output: the query that predicts the target piece | input: the query "
                                               "whose input it is")


WORD_START = "\u2581"  # SentencePiece's "▁": a space in the text


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # a bool is an int to Python, not a number here


def check_alignment_options(model: Transformer, layer: int, heads: list[int] | None, position: str) -> None:
    """Errors that name the option and say what to write: ``alignment_layer`` a decoder layer number,
    ``alignment_heads`` a list of head numbers (or None), ``alignment_position`` input or output."""
    n_layers, n_heads = model.config.n_decoder_layers, model.config.n_heads
    if not is_int(layer) or not -n_layers <= layer < n_layers:
        raise ValueError(f"alignment_layer={layer!r}: give a decoder layer number, 0..{n_layers - 1} (the decoder "
                         f"has {n_layers} layers), or -1 for the last")
    if heads is not None and (not isinstance(heads, (list, tuple)) or not heads
                              or any(not is_int(h) or not 0 <= h < n_heads for h in heads)):
        raise ValueError(f"alignment_heads={heads!r}: give a list of head numbers in 0..{n_heads - 1}, such as "
                         f"alignment_heads=[0,{n_heads - 1}], or null for the mean of all heads")
    if position not in ALIGNMENT_POSITIONS:
        raise ValueError(f"alignment_position={position!r}: use one of {', '.join(ALIGNMENT_POSITIONS)}")


def word_ids(texts: list[str]) -> list[int]:
    """Word index of each piece, given the text of each (``texts``), the words being the whitespace-separated
    words of their concatenation: a piece belongs to the word of its first visible character; a piece without
    one (whitespace, or no text) to the next piece that has one, or, after the last visible character, to no
    word (-1)."""
    ids, word, in_word, pending = [], -1, False, 0  # pending: pieces waiting for the next visible character
    for text in texts:
        first = None
        for char in text:
            if char.isspace():
                in_word = False
                continue
            if not in_word:
                word, in_word = word + 1, True
            first = word if first is None else first
        if first is None:
            pending += 1
            continue
        ids += [first] * (pending + 1)
        pending = 0
    return ids + [-1] * pending


def piece_alignment(model: Transformer, src: list[int], hyp: list[int], bos_id: int,
                    layer: int = AlignmentOptions.alignment_layer, heads: list[int] | None = None,
                    position: str = AlignmentOptions.alignment_position) -> Tensor:
    """Cross-attention of each target piece of ``hyp`` (ids without bos/eos) over the source pieces of
    ``src`` (ids ending in eos), averaged over ``heads`` of decoder ``layer``. -> (len(hyp), len(src))"""
    check_alignment_options(model, layer, heads, position)
    weights = teacher_forced_attention(model, src, hyp, bos_id)["cross"][layer]  # (h, T + 1, S): query t, piece t - 1
    weights = weights.mean(0) if heads is None else weights[heads].mean(0)  # (T + 1, S)
    return weights[1:] if position == "input" else weights[:-1]  # (T, S)


def word_alignment(piece_weights: Tensor, src_words: list[int], tgt_words: list[int]) -> Tensor:
    """Merge pieces into words. piece_weights (T, S) over target/source pieces; ``src_words`` (S,) and
    ``tgt_words`` (T,) give each piece's word, -1 for a piece outside every word (the eos), which is dropped.
    -> (target words, source words), each row summing to 1."""
    src_index, tgt_index = torch.tensor(src_words, dtype=torch.long), torch.tensor(tgt_words, dtype=torch.long)
    n_src, n_tgt = max(src_words, default=-1) + 1, max(tgt_words, default=-1) + 1
    keep_src, keep_tgt = src_index >= 0, tgt_index >= 0
    weights = piece_weights[keep_tgt][:, keep_src]  # (T', S')
    by_src = torch.zeros(weights.shape[0], n_src).index_add_(1, src_index[keep_src], weights)  # sum: (T', Ws)
    by_tgt = torch.zeros(n_tgt, n_src).index_add_(0, tgt_index[keep_tgt], by_src)  # (Wt, Ws)
    by_tgt /= torch.bincount(tgt_index[keep_tgt], minlength=n_tgt).unsqueeze(1)  # mean over a word's pieces
    return by_tgt / by_tgt.sum(1, keepdim=True).clamp_min(1e-12)


def hard_alignment(soft: Tensor) -> list[tuple[int, int]]:
    """(source word, target word) pairs: each target word with its most attended source word."""
    if soft.shape[1] == 0:  # a source without words aligns nothing
        return []
    return [(int(i), j) for j, i in enumerate(soft.argmax(1))]


def format_hard(pairs: list[tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j}" for i, j in pairs)


def format_soft(soft: Tensor) -> str:
    return " ".join(",".join(f"{w:.3f}" for w in row) for row in soft.tolist())


def alignment_error_rate(predicted: set[tuple[int, int]], sure: set[tuple[int, int]],
                         possible: set[tuple[int, int]] | None = None) -> float:
    """Och and Ney (2003): AER = 1 - (|A & S| + |A & P|) / (|A| + |S|), with A the predicted pairs, S the sure
    gold pairs and P the possible ones (S is a subset of P; P = S when not given). 0 is perfect."""
    possible = sure | (possible or set())
    if not predicted and not sure:
        return 0.0
    return 1.0 - (len(predicted & sure) + len(predicted & possible)) / (len(predicted) + len(sure))


def piece_words(tokenizer, src: list[int], hyp: list[int]) -> tuple[list[int], list[int]]:
    """The word of each piece of ``src`` (ids ending in eos, which belongs to no word: -1) in the input line, and
    of each piece of ``hyp`` in the printed translation (see the module docstring)."""
    src_words = word_ids([tokenizer.id_to_piece(i).replace(WORD_START, " ") for i in src[:-1]]) + [-1]
    return src_words, word_ids(tokenizer.surfaces(hyp))


def align(model: Transformer, tokenizer, src: list[int], hyp: list[int],
          layer: int = AlignmentOptions.alignment_layer, heads: list[int] | None = None,
          position: str = AlignmentOptions.alignment_position) -> Tensor:
    """Soft word alignment (target words, source words) of one translation: pieces as ``tokenizer`` splits them
    (the source's final eos belongs to no word)."""
    pieces = piece_alignment(model, src, hyp, tokenizer.bos_id, layer, heads, position)  # (T, S)
    return word_alignment(pieces, *piece_words(tokenizer, src, hyp))


def alignment_line(soft: Tensor, mode: str) -> str:
    """The text printed beside a translation for ``print_alignment=mode``, one of ALIGNMENT_MODES (translate
    checks the option)."""
    return format_hard(hard_alignment(soft)) if mode == "hard" else format_soft(soft)
