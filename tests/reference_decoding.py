"""Slow references for the searches, and the random inputs they are checked on: tiny random models and source
batches, each model's next-token log-probabilities, greedy and beam search written as plainly as possible (one
sentence, no cache, no batching), and a toy Markov "model" whose best translation is known in advance."""

import torch

from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID
from transformer_nmt.generation.search import length_penalty as gnmt_length_penalty
from transformer_nmt.model.transformer import DecoderCache, Transformer, TransformerConfig

IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID}  # the tokenizer's special ids, which the searches take

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def random_model(seed, vocab=12, **overrides):
    torch.manual_seed(seed)
    fields = dict(vocab_size=vocab, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32,
                  dropout=0.0, max_positions=40)
    fields.update(overrides)
    model = Transformer(TransformerConfig(**fields)).eval()
    with torch.no_grad():  # sharpen the output distribution so that eos is reached at varied lengths
        model.src_embed.weight.mul_(4.0)
    return model


def random_sources(seed, vocab=12, B=4, S=6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (B, S), generator=g)
    src[1, 3:] = PAD
    src[3, 5:] = PAD
    return src


def model_log_probs(model):
    """next_log_probs(src (1, S), tokens) -> (V,) for one model: its last logits, pad and bos forbidden, log-softmax."""
    def next_log_probs(src, tokens):
        logits = model(src, torch.tensor([tokens]))[0, -1]
        logits[[PAD, BOS]] = float("-inf")
        return torch.log_softmax(logits, -1)
    return next_log_probs


@torch.no_grad()
def reference_greedy(model, src_row, max_len, next_log_probs=None):
    """One sentence, no cache: recompute the whole prefix at every step (``next_log_probs``: as
    ``model_log_probs`` gives, by default the model's)."""
    next_log_probs = next_log_probs or model_log_probs(model)
    src = src_row[src_row != PAD].unsqueeze(0)
    tokens = [BOS]
    for _ in range(max_len):
        token = int(next_log_probs(src, tokens).argmax())
        if token == EOS:
            break
        tokens.append(token)
    return tokens[1:]


@torch.no_grad()
def reference_beam(model, src_row, k, alpha, max_len, stop="bound", n_best=1, next_log_probs=None, lp=None):
    """One sentence, no cache, no batching: the beam search rule written as plainly as possible.
    Returns the n_best finished (tokens, normalised score), best first. ``lp(n, alpha)``: the length penalty
    (default GNMT's)."""
    next_log_probs = next_log_probs or model_log_probs(model)
    length_penalty = lp or gnmt_length_penalty
    src = src_row[src_row != PAD].unsqueeze(0)
    beams = [([], 0.0)]  # (generated tokens, sum of log-probs)
    finished = []
    for step in range(max_len):
        candidates = []
        for tokens, score in beams:
            log_probs = next_log_probs(src, [BOS] + tokens)
            candidates += [(score + log_probs[t].item(), tokens, t) for t in range(log_probs.numel())
                           if t not in (PAD, BOS)]
        candidates.sort(key=lambda c: -c[0])
        at_limit = step + 1 == max_len
        beams = []
        for rank, (score, tokens, t) in enumerate(candidates[: 2 * k]):
            if t == EOS and rank >= k:
                continue
            if t == EOS or at_limit:  # |Y| = step + 1: the tokens and the eos
                finished.append((tokens + ([] if t == EOS else [t]), score / length_penalty(step + 1, alpha)))
            elif len(beams) < k:
                beams.append((tokens + [t], score))
        finished = sorted(finished, key=lambda f: -f[1])[:k]
        if at_limit:
            break
        if stop == "k_finished" and len(finished) == k:
            break
        # No live beam can end above beams[0]'s score divided by the largest length penalty.
        if stop == "bound" and len(finished) >= n_best and \
                finished[n_best - 1][1] >= beams[0][1] / length_penalty(max_len, alpha):
            break
    return finished[:n_best]


class MarkovTable:
    """A toy 'model' whose next-token distribution depends on the last token only: probs[last] (V,)."""

    def __init__(self, probs):
        self.log_probs = torch.tensor(probs).clamp_min(1e-9).log()  # (V, V)
        self.config = TransformerConfig(vocab_size=len(probs), max_positions=40)

    def encode(self, src):
        return torch.zeros(*src.shape, 1)  # (B, S, 1)

    def new_cache(self):
        return DecoderCache(n_layers=1)  # stays empty: the table needs no history

    def decode(self, tgt_in, memory, src, cache=None):
        return self.log_probs[tgt_in].clone()  # (B, T, V)

    def __call__(self, src, tgt_in):
        return self.decode(tgt_in, None, src)


def early_eos_table():
    """bos -> a .6 | eos .4;  a -> c .7 | eos .3;  c -> d .99;  d -> eos .99. Greedy says "a c d"."""
    a, c, d, V = 4, 5, 6, 8
    probs = [[0.0] * V for _ in range(V)]
    probs[BOS][a], probs[BOS][EOS] = 0.6, 0.4
    probs[a][c], probs[a][EOS] = 0.7, 0.3
    probs[c][d], probs[c][EOS] = 0.99, 0.01
    probs[d][EOS], probs[d][a] = 0.99, 0.01
    for row in (PAD, UNK, EOS, 7):
        probs[row][EOS] = 1.0
    return MarkovTable(probs), [a, c, d]
