"""Synthetic batches of a learnable task at WMT's sentence lengths, for benchmarks and checks that need no corpus
(scripts/gpu_check.py): cut by the project's own sampler, so they are shaped as training batches are."""

from __future__ import annotations

import math

import numpy as np

from transformer_nmt.data.batching import TokenBucketBatchSampler, pad_pairs, pair_widths

N_SPECIAL = 4  # ids 0..3: pad, unk, bos, eos


def synthetic_batches(n_batches: int, vocab: int, max_tokens: int, pairs: int, seed: int = 0,
                      multiple: int = 1) -> list[dict]:
    """Up to ``n_batches`` batches of at most ``max_tokens`` padded tokens per side (widths a multiple of
    ``multiple``), drawn from ``pairs`` sentence pairs: Zipf-distributed source ids, the target the same sentence
    through a fixed permutation of the vocabulary with lengths within +-20%; lengths log-normal (median 25
    subwords, as WMT14 en-de with a 37k BPE vocabulary)."""
    rng = np.random.default_rng(seed)
    src_lens = np.clip(rng.lognormal(math.log(25), 0.55, pairs), 1, 250).astype(np.int64)
    tgt_lens = np.clip(src_lens * rng.uniform(0.8, 1.2, len(src_lens)), 1, 250).astype(np.int64)
    permutation = rng.permutation(vocab - N_SPECIAL) + N_SPECIAL
    sampler = TokenBucketBatchSampler(pair_widths(src_lens, tgt_lens), max_tokens, seed=seed,
                                      pad_to_multiple=multiple)
    batches = []
    for indices in sampler:
        ragged = []
        src_ids = [(rng.zipf(1.2, src_lens[i]) % (vocab - N_SPECIAL)) + N_SPECIAL for i in indices]
        targets = [permutation[np.resize(s - N_SPECIAL, tgt_lens[i])] for s, i in zip(src_ids, indices)]
        for ids in (src_ids, targets):
            ragged.append((np.concatenate(ids), np.r_[0, np.cumsum([len(x) for x in ids])]))
        batches.append(pad_pairs(ragged[0], ragged[1], indices, multiple))
        if len(batches) == n_batches:
            return batches
    return batches
