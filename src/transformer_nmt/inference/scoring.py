"""Scoring given translations: the log-probability a model (or an ensemble, or a CTranslate2 export) gives each
reference, teacher-forced, without decoding (``translate score_reference=FILE``).

A reference's log-probability is the sum over its tokens and the eos that ends it of log p(token | source,
tokens before), under the distribution the searches decode from (pad and bos forbidden; an ensemble's: the mean
of its models' log-probabilities). Pairs are batched by source tokens as ``translate`` batches them; a pair's
score does not depend on the batch it is in.
"""

from __future__ import annotations

import torch

from transformer_nmt.data.language_tags import Direction
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.ensemble import Ensemble, teacher_forced_log_probs
from transformer_nmt.inference.batches import token_batches
from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
from transformer_nmt.model.transformer import Transformer


def encode_pairs(tokenizer: Tokenizer, sources: list[str], references: list[str], max_positions: int,
                 direction: Direction | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """(source ids + eos, reference ids + eos) per pair; over-long sides are an error naming the line.
    ``direction``: a tagged model's (data/language_tags.py), whose tag leads each source."""
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} input lines but {len(references)} reference lines: give one per line")
    if direction is not None and direction.tags.decoder_piece(direction.tgt):
        raise ValueError("a model with decoder-side language tags (data.lang_tags=decoder) cannot score given "
                         "translations yet; use one tagged on the source side")
    texts = [s.strip() for s in sources]
    encoded = tokenizer.encode_batch(texts) if direction is None else direction.encode(tokenizer, texts)
    src_ids = [ids + [tokenizer.eos_id] for ids in encoded]
    ref_ids = [ids + [tokenizer.eos_id] for ids in tokenizer.encode_batch([r.strip() for r in references])]
    for number, (s, r) in enumerate(zip(src_ids, ref_ids), start=1):
        if max(len(s), len(r) + 1) > max_positions:
            raise ValueError(f"line {number}: {len(s)} source and {len(r)} reference tokens; the model takes at "
                             f"most {max_positions} a side (bos counted on the reference side)")
    return src_ids, ref_ids


@torch.no_grad()
def token_log_probs(model: Transformer | Ensemble | CTranslate2Model, tokenizer: Tokenizer, sources: list[str],
                    references: list[str], max_tokens: int, direction: Direction | None = None) -> list[list[float]]:
    """Per pair the log-probability of each reference token and of the final eos, in order (``direction``: a
    tagged model's)."""
    src_ids, ref_ids = encode_pairs(tokenizer, sources, references, model.config.max_positions, direction)
    return ids_log_probs(model, tokenizer, src_ids, ref_ids, max_tokens)


@torch.no_grad()
def ids_log_probs(model: Transformer | Ensemble | CTranslate2Model, tokenizer: Tokenizer, src_ids: list[list[int]],
                  ref_ids: list[list[int]], max_tokens: int) -> list[list[float]]:
    """As ``token_log_probs``, from ids: sources and references each ending in eos."""
    if isinstance(model, CTranslate2Model):
        return model.score_ids(src_ids, ref_ids, max_tokens)
    device, pad = model.device, model.config.pad_id
    results: list[list[float]] = [[] for _ in src_ids]
    for batch in token_batches([max(len(src_ids[i]), len(ref_ids[i])) for i in range(len(src_ids))], max_tokens):
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(src_ids[i]) for i in batch], batch_first=True,
                                              padding_value=pad).to(device)  # (b, S)
        tgt = torch.nn.utils.rnn.pad_sequence([torch.tensor([tokenizer.bos_id] + ref_ids[i]) for i in batch],
                                              batch_first=True, padding_value=pad).to(device)  # (b, T + 1)
        log_probs = teacher_forced_log_probs(model, src, tgt[:, :-1], tokenizer.bos_id)  # (b, T, V)
        picked = log_probs.gather(-1, tgt[:, 1:].unsqueeze(-1)).squeeze(-1).tolist()  # (b, T)
        for row, i in enumerate(batch):
            results[i] = picked[row][: len(ref_ids[i])]
    return results
