"""Alignment quality where the truth is known: a tiny Transformer learns to copy a sequence of symbols in a
fixed reordering (target position j holds source position PERMUTATION[j]), then the hard alignments of each
decoder layer, and of each position (input or output, see transformer_nmt.alignment), are scored with AER
against the gold pairs (PERMUTATION[j], j). A few seconds on one CPU core:

    python -m transformer_nmt.alignment_aer            # prints the markdown table of AER per layer and position

tests/test_alignment.py checks the default alignments against the gold permutation with the same pieces.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_nmt.inference.alignment import (
    ALIGNMENT_POSITIONS,
    alignment_error_rate,
    hard_alignment,
    piece_alignment,
    word_alignment,
)
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.provenance import provenance_line

PERMUTATION = (3, 0, 6, 1, 5, 2, 4)  # target j copies source PERMUTATION[j]
N_SPECIAL, N_SYMBOLS = 4, 16  # ids 0..3 are pad, unk, bos, eos; the symbols follow
RECIPE = {"steps": 400, "batch_size": 64, "lr": 5e-3, "seed": 0}
MODEL = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 2, "d_ff": 64, "dropout": 0.0,
         "max_positions": 16, "norm_first": True}  # pre-LN: learns the task in a third of the steps of post-LN


def permutation_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """src (B, n + 1) symbols + eos; tgt (B, n + 2) bos + reordered symbols + eos."""
    symbols = torch.randint(N_SPECIAL, N_SPECIAL + N_SYMBOLS, (batch_size, len(PERMUTATION)), generator=generator)
    eos = torch.full((batch_size, 1), EOS_ID)
    bos = torch.full((batch_size, 1), BOS_ID)
    return torch.cat([symbols, eos], 1), torch.cat([bos, symbols[:, list(PERMUTATION)], eos], 1)


def train_permutation_model(steps: int = RECIPE["steps"], batch_size: int = RECIPE["batch_size"],
                            lr: float = RECIPE["lr"], seed: int = RECIPE["seed"]) -> Transformer:
    """A plain Adam loop on fresh random batches; about 3 s on one core (more threads only slow it down)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = Transformer(TransformerConfig(vocab_size=N_SPECIAL + N_SYMBOLS, pad_id=PAD_ID, **MODEL))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        src, tgt = permutation_batch(batch_size, generator)
        logits = model(src, tgt[:, :-1])  # (B, n + 1, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def gold_pairs() -> set[tuple[int, int]]:
    return {(i, j) for j, i in enumerate(PERMUTATION)}


@torch.no_grad()
def aer_table(model: Transformer, n_sentences: int = 50, seed: int = 1) -> dict[tuple[int, str], float]:
    """{(decoder layer, position): AER over ``n_sentences`` fresh test sequences}, heads averaged; the
    alignments are of the reference target, each symbol one word (the eos in no word)."""
    src, tgt = permutation_batch(n_sentences, torch.Generator().manual_seed(seed))
    n = len(PERMUTATION)
    table = {}
    for layer in range(model.config.n_decoder_layers):
        for position in ALIGNMENT_POSITIONS:
            predicted, gold = set(), set()
            for s in range(n_sentences):
                pieces = piece_alignment(model, src[s].tolist(), tgt[s, 1:-1].tolist(), BOS_ID, layer, None, position)
                soft = word_alignment(pieces, list(range(n)) + [-1], list(range(n)))
                predicted |= {(s, i, j) for i, j in hard_alignment(soft)}
                gold |= {(s, i, j) for i, j in gold_pairs()}
            table[layer, position] = alignment_error_rate(predicted, gold)
    return table


def markdown(table: dict[tuple[int, str], float]) -> str:
    layers = sorted({layer for layer, _ in table})
    lines = ["| decoder layer | " + " | ".join(f"AER, {p} position" for p in ALIGNMENT_POSITIONS) + " |",
             "| --- |" + " --- |" * len(ALIGNMENT_POSITIONS)]
    lines += [f"| {layer} | " + " | ".join(f"{table[layer, p]:.3f}" for p in ALIGNMENT_POSITIONS) + " |"
              for layer in layers]
    return "\n".join(lines)


def main() -> None:
    """The command line of transformer_nmt.alignment_aer: train, then print the table."""
    torch.set_num_threads(1)
    print(provenance_line({"recipe": RECIPE, "model": MODEL, "permutation": list(PERMUTATION)}))
    start = time.perf_counter()
    model = train_permutation_model()
    trained = time.perf_counter() - start
    print(f"trained {RECIPE['steps']} steps in {trained:.1f} s; permutation {PERMUTATION}; model {MODEL}")
    print(markdown(aer_table(model)))
