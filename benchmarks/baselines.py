"""Old implementations, kept only to be timed side by side with the package's current ones (imported by the
benchmark scripts, which run with benchmarks/ on sys.path). Each is as it was, so that a benchmark's "before" rows
measure what the project had. So that a speed-up never hides a different result, the losses are checked against
the current one before anything is timed (``check_loss``), dropout swaps must leave none of dropout.py's, and the
search table counts the outputs identical to the baseline's ("same").

- ``before_greedy``, ``before_beam``: the search before decoding.py's batched one (commit b8dae0a), one Python loop
  over sentences per step (benchmarks/benchmark_decode.py's ``search`` table).
- ``previous_greedy``, ``previous_beam``: decoding.py's batched searches before issue 31 (commit 9584b1c), before
  ensembles, prefixes and log-probabilities (benchmarks/benchmark_decode.py's ``search`` table: "before issue 31").
- ``unchunked_loss``: the label-smoothed loss before it ran in chunks (benchmarks/benchmark_loss.py's "before");
  ``previous_loss``: the chunked one before its fused log_softmax/softmax kernels (training.loss's
  ``_SmoothedCrossEntropy``), in the chunks of then (benchmarks/benchmark_step.py ``--previous-loss``).
- ``with_torch_dropout``: torch's ``nn.Dropout`` in place of dropout.py's; ``with_32bit_dropout``: dropout.py's mask
  before it drew 16-bit integers (two elements per 64-bit draw, ``dropout_32bit``), both ``--previous-dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID
from transformer_nmt.generation.search import (
    STOP_RULES,
    first_done_last,
    forbid_special,
    length_penalty,
    max_output_lengths,
    reorder_beams,
    until_eos,
)
from transformer_nmt.model.dropout import Dropout
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.training.loss import LOSS_CHUNK_ELEMENTS, label_smoothed_cross_entropy


# --- decoding: the search as it was (commit b8dae0a), one Python loop over sentences per step ----------------
@torch.no_grad()
def before_greedy(model: Transformer, src: Tensor, bos_id: int, eos_id: int, max_len_offset: int):
    limits = max_output_lengths(model, src, max_len_offset)
    memory, cache = model.encode(src), model.new_cache()
    rows = torch.arange(src.shape[0])
    last = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    outputs = [[] for _ in range(src.shape[0])]
    for step in range(int(limits.max())):
        next_tokens = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model).argmax(-1)
        done = (next_tokens == eos_id) | (step + 1 >= limits[rows])
        for row, token in zip(rows.tolist(), next_tokens.tolist()):
            if token != eos_id:
                outputs[row].append(token)
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            rows, memory, src, next_tokens = rows[keep], memory[keep], src[keep], next_tokens[keep]
            cache.reorder(keep)
        last = next_tokens.unsqueeze(1)
    return outputs


@torch.no_grad()
def before_beam(model: Transformer, src: Tensor, k: int, bos_id: int, eos_id: int, alpha: float,
                max_len_offset: int):
    B = src.shape[0]
    limits = max_output_lengths(model, src, max_len_offset)
    src = src.repeat_interleave(k, dim=0)
    memory, cache = model.encode(src), model.new_cache()
    sentences = torch.arange(B)
    beam_scores = torch.full((B, k), float("-inf"))
    beam_scores[:, 0] = 0.0
    prefixes = torch.empty(B * k, 0, dtype=torch.long)
    last = torch.full((B * k, 1), bos_id, dtype=torch.long)
    finished = [[] for _ in range(B)]
    for step in range(int(limits.max())):
        b = sentences.numel()
        logits = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        vocab = log_probs.shape[-1]
        top_scores, top_ids = (beam_scores.view(b * k, 1) + log_probs).view(b, k * vocab).topk(2 * k, dim=1)
        origins, tokens = top_ids // vocab, top_ids % vocab
        new_beams = (torch.arange(b) * k).unsqueeze(1).repeat(1, k)
        new_tokens = torch.full((b, k), eos_id, dtype=torch.long)
        new_scores = torch.full((b, k), float("-inf"))
        still_searching = []
        for i, sentence in enumerate(sentences.tolist()):
            at_limit = step + 1 >= int(limits[sentence])
            kept = 0
            for rank, (s, origin, token) in enumerate(
                    zip(top_scores[i].tolist(), origins[i].tolist(), tokens[i].tolist())):
                if s == float("-inf"):
                    break
                if token == eos_id and rank >= k:
                    continue
                if token == eos_id or at_limit:
                    generated = prefixes[i * k + origin].tolist() + ([] if token == eos_id else [token])
                    if len(finished[sentence]) < k:
                        finished[sentence].append((generated, s / length_penalty(step + 1, alpha)))
                elif kept < k:
                    new_beams[i, kept], new_tokens[i, kept], new_scores[i, kept] = i * k + origin, token, s
                    kept += 1
            if len(finished[sentence]) < k and not at_limit:
                still_searching.append(i)
        if not still_searching:
            break
        live = torch.tensor(still_searching)
        origin_rows = new_beams[live].view(-1)
        cache.reorder(origin_rows)
        memory, src = memory[origin_rows], src[origin_rows]
        prefixes = torch.cat([prefixes[origin_rows], new_tokens[live].view(-1, 1)], dim=1)
        last = new_tokens[live].view(-1, 1)
        beam_scores = new_scores[live]
        sentences = sentences[live]
    return [max(hyps, key=lambda h: h[1])[0] for hyps in finished]


# --- decoding: decoding.py's batched searches before issue 31 (commit 9584b1c): one model, no prefix, no
# log-probabilities; the current ones step through decoding.next_log_probs (ensembles) ---------------------
@torch.no_grad()
def previous_greedy(model: Transformer, src: Tensor, bos_id: int = BOS_ID, eos_id: int = EOS_ID, *,
                  max_len_offset: int) -> list[list[int]]:
    """Pick the most likely token at each step. src (B, S) -> token ids per sentence (no bos/eos)."""
    B, device = src.shape[0], src.device
    limits = max_output_lengths(model, src, max_len_offset)  # (B,)
    out = torch.full((int(limits.max()), B), eos_id, dtype=torch.long, device=device)  # (T, B)
    memory = model.encode(src)  # (B, S, d_model)
    cache = model.new_cache()
    rows = torch.arange(B, device=device)  # original index of each row still decoding
    last = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    for step in range(out.shape[0]):
        logits = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model)  # (b, V)
        next_tokens = logits.argmax(dim=-1)  # (b,)
        out[step].index_copy_(0, rows, next_tokens)
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
    return until_eos(out.t().tolist(), eos_id)




@torch.no_grad()
def previous_beam(model: Transformer, src: Tensor, beam_size: int, alpha: float,
                max_len_offset: int, n_best: int = 1, bos_id: int = BOS_ID,
                eos_id: int = EOS_ID, stop: str = "bound") -> list[list[tuple[list[int], float]]]:
    """decoding.beam_search before issue 31 (its rule, docstring there); hypotheses as (tokens, score)."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best ({n_best}) must be between 1 and beam_size ({beam_size})")
    if stop not in STOP_RULES:
        raise ValueError(f"stop must be one of {STOP_RULES}, got {stop!r}")
    k, device = beam_size, src.device
    B = src.shape[0]
    limits = max_output_lengths(model, src, max_len_offset)  # (B,) of the sentences still searching
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
        logits = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model)  # (b*width, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
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
        new_fin = torch.where(finishing, top_scores / length_penalty(step + 1, alpha), float("-inf"))
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
            best_reachable = alive_scores[:, 0] / length_penalty(limits.float(), alpha)  # (b,)
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
    return [[(ids, score) for ids, score in zip(until_eos(tokens[i], eos_id), scores[i])
             if score > float("-inf")][:n_best] for i in range(B)]


# --- the loss before its fused kernels ------------------------------------------------------------------------
class LogSumExpLoss(torch.autograd.Function):
    """The loss's previous implementation (training._SmoothedCrossEntropy before the fused log_softmax/softmax
    kernels), for ``--previous-loss``: log-sum-exp written out, exp(x - lse) recomputed in the backward pass."""

    @staticmethod
    def forward(ctx, logits, labels, epsilon, pad_id, overwrite):
        n, vocab = logits.shape
        keep = (labels != pad_id).float()
        lse = torch.empty(n, dtype=torch.float32)
        sums = torch.zeros(2, dtype=torch.float32)
        rows = max(1, LOSS_CHUNK_ELEMENTS // vocab)
        with torch.autocast("cpu", enabled=False):
            for start in range(0, n, rows):
                chunk = slice(start, start + rows)
                x = logits[chunk].float()
                z = torch.logsumexp(x, dim=-1)
                nll = z - x.gather(-1, labels[chunk, None]).squeeze(-1)
                smoothed = (1.0 - epsilon) * nll + epsilon * (z - x.mean(dim=-1))
                sums += torch.stack([smoothed, nll]) @ keep[chunk]
                lse[chunk] = z
        ctx.save_for_backward(logits, labels, lse, keep)
        ctx.epsilon, ctx.overwrite = epsilon, overwrite
        loss, nll = sums.unbind()
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        logits, labels, lse, keep = ctx.saved_tensors
        n, vocab = logits.shape
        eps = ctx.epsilon
        grad = logits if ctx.overwrite else torch.empty_like(logits)
        rows = max(1, LOSS_CHUNK_ELEMENTS // vocab)
        with torch.autocast("cpu", enabled=False):
            for start in range(0, n, rows):
                chunk = slice(start, start + rows)
                g = torch.exp(logits[chunk].float() - lse[chunk, None]) - eps / vocab
                g.scatter_add_(-1, labels[chunk, None], g.new_full((g.shape[0], 1), eps - 1.0))
                g *= (keep[chunk] * grad_loss)[:, None]
                grad[chunk] = g
        return grad, None, None, None, None


def unchunked_loss(logits, labels, epsilon, pad_id):
    """The label-smoothed loss before the chunked one (fp32 log-softmax kept for backward, boolean indexing):
    benchmarks/benchmark_loss.py's "before"."""
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    uniform = -log_probs.mean(dim=-1)  # (B, T)
    keep = labels != pad_id  # (B, T)
    smoothed = (1.0 - epsilon) * nll + epsilon * uniform
    return smoothed[keep].sum(), nll[keep].sum(), keep.sum()


def previous_loss(logits, labels, epsilon, pad_id, overwrite_logits=False):
    """label_smoothed_cross_entropy's signature and results (loss sum, nll sum, tokens), the previous way."""
    vocab = logits.shape[-1]
    loss, nll = LogSumExpLoss.apply(logits.reshape(-1, vocab), labels.reshape(-1), epsilon, pad_id, overwrite_logits)
    return loss, nll, (labels != pad_id).sum()


def check_loss(loss_fn) -> None:
    """Stop unless ``loss_fn`` (a loss of label_smoothed_cross_entropy's signature) gives the current loss's values
    and gradient, padding included."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 50, generator=g)
    labels = torch.randint(1, 50, (2, 7), generator=g)
    labels[1, 4:] = 0
    results = []
    for fn in (label_smoothed_cross_entropy, loss_fn):
        x = logits.clone().requires_grad_()
        loss, nll, n = fn(x, labels, 0.1, 0)
        loss.backward()
        results.append((loss, nll, n, x.grad))
    for new, old in zip(*results):
        if not torch.allclose(new.double(), old.double(), rtol=1e-6, atol=1e-7):
            raise SystemExit(f"baselines.{loss_fn.__name__} no longer computes the current loss: a benchmark against "
                             f"it would compare different computations")


# --- dropout: torch's, before dropout.py; dropout.py's before 16-bit integers --------------------------------------
def dropout_32bit(x: Tensor, p: float, training: bool = True) -> Tensor:
    """dropout.py's ``dropout`` before issue 36: one 64-bit draw gives two uniform 32-bit integers, an element is
    dropped when its integer is below -2^31 + round(p * 2^32), and the mask is made a float copy of x's dtype."""
    if not training or p == 0.0:
        return x
    threshold = round(p * 2 ** 32)
    if x.device.type != "cpu" or threshold >= 2 ** 32:
        return F.dropout(x, p, training=True)
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int64).random_(-(2 ** 63), None)
    uniform = bits.view(torch.int32)[:n]
    keep = (uniform >= -(2 ** 31) + threshold).view(x.shape).to(x.dtype)
    return x.mul(1.0 / (1.0 - p)).mul_(keep)


class Dropout32(torch.nn.Module):
    """``dropout_32bit`` as a module (identity in eval mode), in place of dropout.py's ``Dropout``."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout_32bit(x, self.p, self.training)


def _swap_dropout(model: torch.nn.Module, make, what: str) -> int:
    swapped = 0
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, make(child.p))
                swapped += 1
    if swapped == 0 or any(isinstance(m, Dropout) for m in model.modules()):
        raise SystemExit(f"{what}: swapped {swapped} dropouts, some of dropout.py's left or none found")
    return swapped


def with_torch_dropout(model: torch.nn.Module) -> int:
    """Replace every dropout.py ``Dropout`` of ``model`` by torch's ``nn.Dropout`` (a bernoulli_ mask) of the same
    p, in place; returns how many. Stops if one is left (a new kind of module holding it elsewhere)."""
    return _swap_dropout(model, torch.nn.Dropout, "with_torch_dropout")


def with_32bit_dropout(model: torch.nn.Module) -> int:
    """Replace every dropout.py ``Dropout`` of ``model`` by ``Dropout32`` (its mask before 16-bit integers), in place;
    returns how many. Stops if one is left."""
    return _swap_dropout(model, Dropout32, "with_32bit_dropout")
