"""Greedy and beam-search decoding with the incremental attention cache (paper section 6.1).

The paper decodes with beam size 4, length penalty alpha = 0.6 (Wu et al. 2016:
lp(Y) = ((5 + |Y|) / 6) ** alpha) and a maximum output length of source length + 50.
Both searches stop each sentence on its own: a sentence that has finished leaves the
batch, so it costs nothing while the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_nmt.model import Transformer

BOS_ID, EOS_ID = 2, 3


def length_penalty(length: int | Tensor, alpha: float):
    """GNMT length penalty ((5 + length) / 6) ** alpha; scores are divided by it."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(model: Transformer, src: Tensor, max_len_offset: int) -> Tensor:
    """(B,) most tokens each sentence may generate: source length + offset, within max_positions."""
    src_lengths = (src != model.config.pad_id).sum(dim=1)
    return (src_lengths + max_len_offset).clamp(min=1, max=model.config.max_positions - 1)


def forbid_special(logits: Tensor, bos_id: int, model: Transformer) -> Tensor:
    """Padding and bos are never valid outputs: give them probability 0."""
    logits[:, [model.config.pad_id, bos_id]] = float("-inf")
    return logits


@torch.no_grad()
def greedy_decode(model: Transformer, src: Tensor, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
                  max_len_offset: int = 50) -> list[list[int]]:
    """Pick the most likely token at each step. src (B, S) -> token ids per sentence (no bos/eos)."""
    limits = max_output_lengths(model, src, max_len_offset)  # (B,)
    memory = model.encode(src)  # (B, S, d_model)
    cache = model.new_cache()
    rows = torch.arange(src.shape[0], device=src.device)  # original index of each row still decoding
    last = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    outputs: list[list[int]] = [[] for _ in range(src.shape[0])]
    for step in range(int(limits.max())):
        logits = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model)  # (b, V)
        next_tokens = logits.argmax(dim=-1)  # (b,)
        done = (next_tokens == eos_id) | (step + 1 >= limits[rows])
        for row, token in zip(rows.tolist(), next_tokens.tolist()):
            if token != eos_id:
                outputs[row].append(token)
        if done.all():
            break
        if done.any():  # drop finished sentences from the batch
            keep = (~done).nonzero().squeeze(1)
            rows, memory, src, next_tokens = rows[keep], memory[keep], src[keep], next_tokens[keep]
            cache.reorder(keep)
        last = next_tokens.unsqueeze(1)  # (b, 1)
    return outputs


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without bos and eos
    score: float  # sum of log-probabilities divided by the length penalty


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, beam_size: int = 4, alpha: float = 0.6,
                max_len_offset: int = 50, n_best: int = 1, bos_id: int = BOS_ID,
                eos_id: int = EOS_ID) -> list[list[Hypothesis]]:
    """Batched beam search. src (B, S) -> for each sentence its ``n_best`` hypotheses, best first.

    Each step expands every live beam and takes the 2k best continuations of each sentence;
    those among the k best that end in eos join the sentence's finished list, and the k best
    that do not end in eos stay alive. A
    sentence is done once it has k finished hypotheses, or at its length limit (then its live
    beams are finished as they stand).
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best ({n_best}) must be between 1 and beam_size ({beam_size})")
    k, device = beam_size, src.device
    B = src.shape[0]
    limits = max_output_lengths(model, src, max_len_offset)  # (B,)
    # Every sentence starts with k copies of its source; only beam 0 is live at step 0.
    src = src.repeat_interleave(k, dim=0)  # (B*k, S)
    memory = model.encode(src)  # (B*k, S, d_model)
    cache = model.new_cache()
    sentences = torch.arange(B, device=device)  # original index of each sentence still searching
    beam_scores = torch.full((B, k), float("-inf"), device=device)
    beam_scores[:, 0] = 0.0
    prefixes = torch.empty(B * k, 0, dtype=torch.long, device=device)  # generated tokens so far
    last = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]

    for step in range(int(limits.max())):
        b = sentences.numel()
        logits = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model)  # (b*k, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        vocab = log_probs.shape[-1]
        candidates = (beam_scores.view(b * k, 1) + log_probs).view(b, k * vocab)  # (b, k*V)
        top_scores, top_ids = candidates.topk(2 * k, dim=1)  # (b, 2k)
        origins, tokens = top_ids // vocab, top_ids % vocab  # beam of origin, new token

        # Flat row of each new beam's origin; unfilled slots stay dead (score -inf).
        new_beams = (torch.arange(b, device=device) * k).unsqueeze(1).repeat(1, k)  # (b, k)
        new_tokens = torch.full((b, k), eos_id, dtype=torch.long, device=device)
        new_scores = torch.full((b, k), float("-inf"), device=device)
        still_searching = []
        for i, sentence in enumerate(sentences.tolist()):
            at_limit = step + 1 >= int(limits[sentence])
            kept = 0
            for rank, (score, origin, token) in enumerate(
                    zip(top_scores[i].tolist(), origins[i].tolist(), tokens[i].tolist())):
                if score == float("-inf"):
                    break
                if token == eos_id and rank >= k:
                    continue  # an eos below the k best does not end a hypothesis
                if token == eos_id or at_limit:
                    generated = prefixes[i * k + origin].tolist() + ([] if token == eos_id else [token])
                    if len(finished[sentence]) < k:
                        finished[sentence].append(
                            Hypothesis(generated, score / length_penalty(step + 1, alpha)))
                elif kept < k:
                    new_beams[i, kept], new_tokens[i, kept], new_scores[i, kept] = i * k + origin, token, score
                    kept += 1
            if len(finished[sentence]) < k and not at_limit:
                still_searching.append(i)
        if not still_searching:
            break
        # Keep the live sentences only, their k new beams in order; reorder the cache to match.
        live = torch.tensor(still_searching, device=device)
        origin_rows = new_beams[live].view(-1)  # (b'*k,) rows of the previous step
        cache.reorder(origin_rows)
        memory, src = memory[origin_rows], src[origin_rows]
        prefixes = torch.cat([prefixes[origin_rows], new_tokens[live].view(-1, 1)], dim=1)
        last = new_tokens[live].view(-1, 1)
        beam_scores = new_scores[live]
        sentences = sentences[live]

    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:n_best] for hyps in finished]
