"""The loss (paper section 5.4): label-smoothed cross-entropy over the non-padding target tokens, computed in fp32
chunks of rows without a (tokens x vocabulary) buffer of its own."""

from __future__ import annotations

import torch
from torch import Tensor

# Logits per chunk of the loss, so that its fp32 temporaries stay the same size whatever the batch. On a GPU, 128 MiB
# (few kernel launches); on CPU 4 MiB, which stays in cache through the chunk's passes (measured: docs/benchmarks.md,
# "Dropout masks and loss chunks").
LOSS_CHUNK_ELEMENTS = 2 ** 25
LOSS_CHUNK_ELEMENTS_CPU = 2 ** 20


def loss_chunk_elements(device_type: str) -> int:
    """Logits per chunk of the loss on ``device_type`` ("cpu", "cuda", ...)."""
    return LOSS_CHUNK_ELEMENTS_CPU if device_type == "cpu" else LOSS_CHUNK_ELEMENTS


def chunk_rows(vocab: int, device_type: str, chunk_elements: int | None = None) -> int:
    """Rows of ``vocab`` logits per chunk: ``chunk_elements`` logits (None: ``loss_chunk_elements`` of the device),
    at least one row; a ValueError below one element."""
    if chunk_elements is None:
        chunk_elements = loss_chunk_elements(device_type)
    elif chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    return max(1, chunk_elements // vocab)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy summed over the non-pad rows, computed in fp32 over chunks of rows.

    Per row with log-probabilities l = log_softmax(x) and label y: loss = (1 - eps) * (-l_y) + eps * (-mean_j l_j),
    nll = -l_y. Nothing but the logits is kept for the backward pass, which recomputes softmax chunk by chunk:
    d loss / d x_j = softmax(x)_j - (1 - eps) * [j = y] - eps / V, times [y != pad]. No (N, V) buffer is made
    besides the logits themselves, one fp32 chunk, and, unless ``overwrite`` lets the gradient take their place,
    their gradient.

    Both passes use torch's fused (vectorized, one pass per row) log_softmax and softmax kernels, in fp32
    whatever the logits' dtype (``dtype=torch.float32``), rather than log-sum-exp written out (max, subtract,
    exp, sum: a temporary per step): faster, same values (tests/test_training.py; measured in docs/benchmarks.md,
    "The training step against the matmul ceiling").
    """

    @staticmethod
    def forward(ctx, logits, labels, epsilon: float, pad_id: int, overwrite: bool, rows: int):
        # logits (N, V) in the compute dtype, labels (N,); ``rows`` per chunk
        n, vocab = logits.shape
        keep = (labels != pad_id).float()  # (N,): 1 for a real target token, 0 for padding
        sums = torch.zeros(2, dtype=torch.float32, device=logits.device)  # (smoothed loss, nll)
        with torch.autocast(logits.device.type, enabled=False):
            for start in range(0, n, rows):
                chunk = slice(start, start + rows)
                log_probs = torch.log_softmax(logits[chunk], dim=-1, dtype=torch.float32)  # (n_c, V)
                nll = -log_probs.gather(-1, labels[chunk, None]).squeeze(-1)  # (n_c,)
                smoothed = (1.0 - epsilon) * nll - epsilon * log_probs.mean(dim=-1)  # (n_c,)
                sums += torch.stack([smoothed, nll]) @ keep[chunk]  # masked sums: no boolean indexing
        ctx.save_for_backward(logits, labels, keep)
        ctx.epsilon, ctx.overwrite, ctx.rows = epsilon, overwrite, rows
        loss, nll = sums.unbind()
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        logits, labels, keep = ctx.saved_tensors
        n, vocab = logits.shape
        eps = ctx.epsilon
        grad = logits if ctx.overwrite else torch.empty_like(logits)  # (N, V)
        rows = ctx.rows
        with torch.autocast(logits.device.type, enabled=False):
            for start in range(0, n, rows):
                chunk = slice(start, start + rows)
                g = torch.softmax(logits[chunk], dim=-1, dtype=torch.float32)  # (n_c, V)
                g -= eps / vocab
                g.scatter_add_(-1, labels[chunk, None], g.new_full((g.shape[0], 1), eps - 1.0))
                g *= (keep[chunk] * grad_loss)[:, None]
                grad[chunk] = g
        return grad, None, None, None, None, None


def label_smoothed_cross_entropy(logits: Tensor, labels: Tensor, epsilon: float, pad_id: int,
                                 overwrite_logits: bool = False,
                                 chunk_elements: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Section 5.4: cross-entropy against q = (1 - epsilon) * one_hot(label) + epsilon / V.

    This is the uniform label smoothing of Szegedy et al. (2016), which the paper cites, and equals
    ``F.cross_entropy(..., label_smoothing=epsilon, ignore_index=pad_id, reduction="sum")``.
    logits (B, T, V), labels (B, T) -> (smoothed loss summed over non-pad tokens, plain NLL summed over
    the same tokens (for perplexity; not differentiable), number of those tokens); all scalars on the logits'
    device, the sums computed in float32 in chunks of rows, so that at the paper's batch (25k tokens x 37k
    vocabulary) no float32 copy of the logits or of the log-probabilities is ever held. With
    ``overwrite_logits`` the backward pass writes the gradient into the logits' memory: pass it when the
    logits feed nothing but this loss (the training step), and the loss holds no (tokens x V) buffer of its own.
    ``chunk_elements``: logits per chunk (None: ``loss_chunk_elements`` of the logits' device); the values do
    not depend on it beyond fp32 rounding of the sums.
    """
    vocab = logits.shape[-1]
    rows = chunk_rows(vocab, logits.device.type, chunk_elements)
    loss, nll = _SmoothedCrossEntropy.apply(logits.reshape(-1, vocab), labels.reshape(-1), epsilon, pad_id,
                                            overwrite_logits, rows)
    return loss, nll, (labels != pad_id).sum()
