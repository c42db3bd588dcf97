"""Greedy and beam-search decoding with the incremental attention cache (paper section 6.1).

The paper's beam size, length penalty alpha (Wu et al. 2016: lp(Y) = ((5 + |Y|) / 6) ** alpha, where |Y| counts
the generated tokens and the eos that ends them) and maximum output length (source length + an offset) are the
defaults of ``generation.config.DecodeConfig``, their one home: the searches here take them as required
arguments. Both searches are batched and keep their bookkeeping in tensors: per step one host read (how many
sentences are done), and a sentence that is done leaves the batch, so it costs nothing while the others go on.

``model`` is a ``Transformer`` or anything with its decoding interface (``config``, ``encode``, ``new_cache`` and
``next_log_probs``: an ensemble, generation/ensemble.py). ``prefix`` (B, P) forces each sentence's first tokens
(-1 past a sentence's own prefix: free): every other token gets probability 0 at those steps, and the forced
tokens are scored as the model scores them. ``greedy_search`` takes a ``choose`` rule (``argmax`` by default; a
sampler of generation/sampling.py) and reports each output's log-probability. Both take ``processors``
(generation/processors.py): called on each step's log-probabilities before the search chooses, and skipped when
there are none (then the searches are exactly what they were without the hook).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_nmt.generation.processors import Processor, Step, apply_processors
from transformer_nmt.model.transformer import DecoderCache, Transformer

STOP_RULES = ("bound", "k_finished")


LENGTH_PENALTIES = ("gnmt", "power")


def length_penalty(length: int | Tensor, alpha: float, style: str = "gnmt"):
    """What a finished hypothesis's summed log-probability is divided by: GNMT's ((5 + length) / 6) ** alpha (the
    paper's, Wu et al. 2016), or ``power``: length ** alpha (fairseq's --lenpen, CTranslate2's and transformers'
    length_penalty). Both grow with the length for alpha > 0 and are 1 at alpha 0."""
    if style == "power":
        return (length if isinstance(length, Tensor) else float(length)) ** alpha
    return ((5.0 + length) / 6.0) ** alpha


def check_length_penalty(style: str) -> str:
    if style not in LENGTH_PENALTIES:
        raise ValueError(f"length_penalty={style!r}: use one of {LENGTH_PENALTIES}")
    return style


def max_output_lengths(model: Transformer, src: Tensor, max_len_offset: int) -> Tensor:
    """(B,) most tokens each sentence may generate: source length + offset, within max_positions."""
    src_lengths = (src != model.config.pad_id).sum(dim=1)
    return (src_lengths + max_len_offset).clamp(min=1, max=model.config.max_positions - 1)


def forbid_special(logits: Tensor, bos_id: int, model: Transformer) -> Tensor:
    """Padding and bos are never valid outputs: give them probability 0."""
    logits[:, [model.config.pad_id, bos_id]] = float("-inf")
    return logits


def next_log_probs(model, last: Tensor, memory: Tensor, src: Tensor, cache, bos_id: int) -> Tensor:
    """(b, V) float32 log-probabilities of the next token after ``last`` (b, 1), pad and bos forbidden. A model
    with its own ``next_log_probs`` (an ensemble) computes them itself."""
    if hasattr(model, "next_log_probs"):
        return model.next_log_probs(last, memory, src, cache, bos_id)
    logits = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model)  # (b, V)
    return torch.log_softmax(logits.float(), dim=-1)


def force_tokens(log_probs: Tensor, forced: Tensor, model_log_probs: Tensor | None = None) -> Tensor:
    """Rows whose ``forced`` (b,) token is >= 0 may only emit it (at its own log-probability: ``model_log_probs``'s,
    by default ``log_probs``', so a processor cannot forbid a forced token); rows at -1 are free."""
    token = forced.clamp(min=0).unsqueeze(1)  # (b, 1)
    scored = log_probs if model_log_probs is None else model_log_probs
    only = torch.full_like(log_probs, float("-inf")).scatter_(1, token, scored.gather(1, token))
    return torch.where((forced >= 0).unsqueeze(1), only, log_probs)


def prefix_limits(limits: Tensor, prefix: Tensor | None, max_positions: int) -> Tensor:
    """Length limits (B,) raised to each sentence's prefix length, within max_positions."""
    if prefix is None:
        return limits
    return torch.maximum(limits, (prefix >= 0).sum(dim=1)).clamp(max=max_positions - 1)


def argmax(log_probs: Tensor, rows: Tensor, step: int) -> Tensor:
    """Greedy decoding's choice: the most likely token of each row. (b, V) -> (b,)"""
    return log_probs.argmax(dim=-1)


def until_eos(rows: list[list[int]], eos_id: int) -> list[list[int]]:
    """Cut each token row before its first eos (rows are eos-filled past their end)."""
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]


def first_done_last(done: Tensor, n_done: int) -> tuple[Tensor, Tensor]:
    """Indices of the rows not done and of the rows done, each in order, without a host read."""
    order = torch.argsort(done.to(torch.uint8), stable=True)  # (b,) rows not done first
    return order[: done.numel() - n_done], order[done.numel() - n_done:]


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without bos and eos
    score: float  # sum of log-probabilities divided by the length penalty (greedy and sampling: 0.0)
    log_prob: float = 0.0  # sum of log-probabilities of the tokens and of the eos that ends them (if one does)


def greedy_decode(model: Transformer, src: Tensor, *, bos_id: int, eos_id: int, max_len_offset: int
                  ) -> list[list[int]]:
    """Pick the most likely token at each step. src (B, S) -> token ids per sentence (no bos/eos)."""
    return [h.tokens for h in greedy_search(model, src, bos_id=bos_id, eos_id=eos_id, max_len_offset=max_len_offset)]


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, *, bos_id: int, eos_id: int, max_len_offset: int,
                  choose=argmax, prefix: Tensor | None = None, processors: list[Processor] = ()) -> list[Hypothesis]:
    """One token per step, picked by ``choose(log_probs (b, V), rows (b,), step) -> (b,)`` (``rows``: each row's
    sentence in ``src``) from the log-probabilities as ``processors`` leave them; src (B, S) -> per sentence a
    Hypothesis: its tokens (no bos/eos), score 0.0 and log_prob, the sum of the (processed) log-probabilities of
    its tokens and of the eos that ends it (if one does)."""
    B, device = src.shape[0], src.device
    limits = prefix_limits(max_output_lengths(model, src, max_len_offset), prefix, model.config.max_positions)
    out = torch.full((int(limits.max()), B), eos_id, dtype=torch.long, device=device)  # (T, B)
    log_prob = torch.zeros(B, device=device)  # (B,)
    memory = model.encode(src)  # (B, S, d_model)
    cache = model.new_cache()
    rows = torch.arange(B, device=device)  # original index of each row still decoding
    last = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    for step in range(out.shape[0]):
        log_probs = model_log_probs = next_log_probs(model, last, memory, src, cache, bos_id)  # (b, V)
        if processors:
            log_probs = apply_processors(processors, log_probs, Step(out[:step].index_select(1, rows).t(), rows, step))
        if prefix is not None and step < prefix.shape[1]:
            log_probs = force_tokens(log_probs, prefix[rows, step], model_log_probs)
        next_tokens = choose(log_probs, rows, step)  # (b,)
        out[step].index_copy_(0, rows, next_tokens)
        log_prob.index_add_(0, rows, log_probs.gather(1, next_tokens.unsqueeze(1)).squeeze(1))
        done = (next_tokens == eos_id) | (step + 1 >= limits)  # (b,)
        n_done = int(done.sum())  # the one host read per step
        if n_done == done.numel():
            break
        if n_done:  # drop finished sentences from the batch
            keep, _ = first_done_last(done, n_done)
            rows, memory, src, limits, next_tokens = (rows[keep], memory[keep], src[keep], limits[keep],
                                                      next_tokens[keep])
            cache.reorder(keep)
        last = next_tokens.unsqueeze(1)  # (b, 1)
    return [Hypothesis(tokens, 0.0, lp) for tokens, lp in zip(until_eos(out.t().tolist(), eos_id), log_prob.tolist())]




def reorder_beams(cache: DecoderCache, beam_rows: Tensor, sentence_rows: Tensor | None) -> None:
    """Self-attention keys/values follow each new beam from its origin row ``beam_rows`` (b*k,).
    Cross-attention keys/values are the same for every beam of a sentence, so they move only when the
    sentences change (``sentence_rows``, a row of each new beam's sentence; None: no change)."""
    for layer in cache.layers:
        layer.self_attn.reorder(beam_rows)
        if sentence_rows is not None:
            layer.cross_attn.reorder(sentence_rows)


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                max_len_offset: int, n_best: int = 1, stop: str = "bound", prefix: Tensor | None = None,
                penalty: str = "gnmt", processors: list[Processor] = ()) -> list[list[Hypothesis]]:
    """Batched beam search. src (B, S) -> for each sentence its ``n_best`` hypotheses, best first.

    Each step expands the k live beams of every sentence and takes its 2k best continuations (one
    topk over k x V). Those among the k best that end in eos are finished: scored with the length
    penalty of their length (eos counted), they join the sentence's k best finished hypotheses. The
    k best that do not end in eos stay alive. At the length limit every continuation is finished as it
    stands (no eos, |Y| = its tokens).

    A sentence stops at its length limit or, by the ``stop`` rule:
    - ``bound`` (tensor2tensor's): when its ``n_best``-th finished score is at least the best score any
      live beam could still reach. Log-probabilities only fall, so a beam of score s ends at best at
      s / lp(limit), with the longest length (the largest penalty) allowed.
    - ``k_finished`` (the rule before; kept to compare against): as soon as k hypotheses have
      finished. Short hypotheses finish first, so it stops before longer, better ones can end.

    Each hypothesis's ``log_prob`` is its score times the length penalty of its length (``penalty``: gnmt or
    power, ``length_penalty``). ``processors`` rewrite each step's log-probabilities before the candidates are
    ranked (scores are sums of the processed values).
    """
    check_length_penalty(penalty)
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best ({n_best}) must be between 1 and beam_size ({beam_size})")
    if stop not in STOP_RULES:
        raise ValueError(f"stop must be one of {STOP_RULES}, got {stop!r}")
    k, device = beam_size, src.device
    B = src.shape[0]
    limits = prefix_limits(max_output_lengths(model, src, max_len_offset), prefix, model.config.max_positions)  # (B,)
    all_limits = limits.tolist()  # of every sentence, for the log-probabilities at the end
    max_steps = int(limits.max())
    out_scores = torch.full((B, k), float("-inf"), device=device)  # finished, of sentences done
    out_tokens = torch.full((B, k, max_steps), eos_id, dtype=torch.long, device=device)  # eos-filled
    memory = model.encode(src)  # (B, S, d_model), once per sentence
    cache = model.new_cache()
    sentences = torch.arange(B, device=device)  # original index of each sentence still searching
    # Step 0 has one live beam per sentence (bos); from step 1 on, k. Beam j of sentence i is row i*width + j.
    alive_scores = torch.zeros(B, 1, device=device)  # (b, width) sums of log-probs
    alive_tokens = torch.empty(B, 1, 0, dtype=torch.long, device=device)  # (b, width, step)
    fin_scores = torch.full((B, k), float("-inf"), device=device)  # best k finished, normalised, sorted
    fin_tokens = torch.empty(B, k, 0, dtype=torch.long, device=device)  # (b, k, step), eos-filled
    last = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    rank = torch.arange(2 * k, device=device)  # (2k,)

    for step in range(max_steps):
        b, width = alive_scores.shape
        log_probs = model_log_probs = next_log_probs(model, last, memory, src, cache, bos_id)  # (b*width, V)
        if processors:
            log_probs = apply_processors(processors, log_probs, Step(
                alive_tokens.reshape(b * width, step), sentences.repeat_interleave(width), step))
        if prefix is not None and step < prefix.shape[1]:  # every beam of a sentence is forced alike
            log_probs = force_tokens(log_probs, prefix[sentences, step].repeat_interleave(width), model_log_probs)
        vocab = log_probs.shape[-1]
        candidates = (alive_scores.view(b * width, 1) + log_probs).view(b, width * vocab)  # (b, width*V)
        top_scores, top_ids = candidates.topk(2 * k, dim=1)  # (b, 2k), best first
        origins, tokens = top_ids // vocab, top_ids % vocab  # beam of origin, new token
        # Each candidate's tokens: its origin's prefix + the new token. (b, 2k, step+1)
        prefixes = alive_tokens.gather(1, origins.unsqueeze(-1).expand(b, 2 * k, step))
        sequences = torch.cat([prefixes, tokens.unsqueeze(-1)], dim=-1)

        # Finished now: eos among the k best (an eos below them ends nothing), or anything at the limit.
        is_eos = tokens == eos_id  # (b, 2k)
        at_limit = step + 1 >= limits  # (b,)
        finishing = (is_eos & (rank < k)) | (at_limit.unsqueeze(1) & ~is_eos)
        new_fin = torch.where(finishing, top_scores / length_penalty(step + 1, alpha, penalty), float("-inf"))
        fin_tokens = torch.cat([fin_tokens, torch.full((b, k, 1), eos_id, device=device)], dim=-1)
        fin_scores, best = torch.cat([fin_scores, new_fin], dim=1).topk(k, dim=1)  # (b, k)
        fin_tokens = torch.cat([fin_tokens, sequences], dim=1).gather(
            1, best.unsqueeze(-1).expand(b, k, step + 1))  # (b, k, step+1)

        # Alive: the k best that do not end in eos, in rank order.
        pick = torch.argsort(is_eos.to(torch.uint8), dim=1, stable=True)[:, :k]  # (b, k)
        alive_scores = top_scores.gather(1, pick)
        alive_tokens = sequences.gather(1, pick.unsqueeze(-1).expand(b, k, step + 1))
        beam_rows = (torch.arange(b, device=device) * width).unsqueeze(1) + origins.gather(1, pick)  # (b, k)

        if stop == "bound":
            best_reachable = alive_scores[:, 0] / length_penalty(limits.float(), alpha, penalty)  # (b,)
            done = at_limit | (fin_scores[:, n_best - 1] >= best_reachable)
        else:
            done = at_limit | (fin_scores[:, -1] > float("-inf"))
        n_done = int(done.sum())  # the one host read per step: who leaves the batch, and when to stop
        sentence_rows = None
        if n_done or width == 1:  # sentences leave the batch, or (step 0) each gets k rows
            keep = torch.arange(b, device=device)
            if n_done:  # sentences that are done hand in their finished hypotheses and leave
                keep, gone = first_done_last(done, n_done)
                out_scores[sentences[gone]] = fin_scores[gone]
                out_tokens[sentences[gone], :, : step + 1] = fin_tokens[gone]
                if n_done == b:
                    break
                sentences, limits, beam_rows = sentences[keep], limits[keep], beam_rows[keep]
                alive_scores, alive_tokens = alive_scores[keep], alive_tokens[keep]
                fin_scores, fin_tokens = fin_scores[keep], fin_tokens[keep]
            # All beams of a sentence share its memory: any of its rows will do for each new beam.
            sentence_rows = (keep * width).repeat_interleave(k)  # (b'*k,)
            memory, src = memory[sentence_rows], src[sentence_rows]
        reorder_beams(cache, beam_rows.view(-1), sentence_rows)
        last = alive_tokens[:, :, -1].reshape(-1, 1)  # (b'*k, 1)

    scores, tokens = out_scores.tolist(), out_tokens.tolist()
    return [[Hypothesis(ids, score, score * length_penalty(output_length(ids, all_limits[i]), alpha, penalty))
             for ids, score in zip(until_eos(tokens[i], eos_id), scores[i])
             if score > float("-inf")][:n_best] for i in range(B)]


def output_length(tokens: list[int], limit: int) -> int:
    """|Y| of the length penalty: the tokens and the eos that ends them; a hypothesis stopped at the length limit
    has none (an eos fits only within the limit)."""
    return len(tokens) if len(tokens) >= limit else len(tokens) + 1
