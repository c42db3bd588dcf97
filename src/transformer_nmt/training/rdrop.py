"""R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): every batch goes through the model
twice, with two dropout masks, and the loss adds to the two passes' cross-entropies the symmetric KL divergence
between their token distributions,

    L = -log P1(y | x) - log P2(y | x) + alpha * 1/2 (KL(P1 || P2) + KL(P2 || P1)),

which pulls the sub-models that dropout samples towards one prediction. ``train.rdrop_alpha`` sets alpha (0: off,
one pass). The training step runs the two passes as one forward of the batch stacked on itself (one dropout draw
over 2B rows: two masks) and trains on L / 2 per target token: the mean of the passes' label-smoothed
cross-entropies plus alpha / 2 times the symmetric term (the weighting fairseq's R-Drop criterion has). Its cost is
a second forward and backward pass of every batch.

The divergence is computed as the loss is (loss.py): in fp32 chunks of rows, nothing kept for the backward pass but
the logits, which it reads again chunk by chunk. With p = softmax(x), q = softmax(y), a = log p, b = log q per row:
KL(p || q) + KL(q || p) = sum_j (p_j - q_j)(a_j - b_j) =: S, and
dS/dx_k = p_k ((a_k - b_k) - sum_j p_j (a_j - b_j)) + p_k - q_k, dS/dy_k by symmetry (x <-> y).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_nmt.training.loss import chunk_rows


def check_alpha(alpha: float) -> float:
    """``train.rdrop_alpha`` as a float, or a ValueError naming the option."""
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha >= 0.0 or alpha == float("inf"):
        raise ValueError(f"train.rdrop_alpha={alpha!r}: give a finite number >= 0 (0: no R-Drop; the paper's "
                         f"translation runs use 5)")
    return float(alpha)


def _chunk_terms(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(p, q, a - b, S per row) of one chunk of rows, in fp32."""
    a = torch.log_softmax(x, dim=-1, dtype=torch.float32)  # (n_c, V)
    b = torch.log_softmax(y, dim=-1, dtype=torch.float32)  # (n_c, V)
    p, q, d = a.exp(), b.exp(), a - b  # (n_c, V) each
    return p, q, d, ((p - q) * d).sum(dim=-1)  # S: (n_c,)


class _SymmetricKL(torch.autograd.Function):
    """sum over the rows kept of KL(p || q) + KL(q || p), p = softmax(x), q = softmax(y); fp32, chunks of rows."""

    @staticmethod
    def forward(ctx, x, y, keep, rows: int):
        # x, y (N, V) in the compute dtype; keep (N,) float: 1 for a real target token, 0 for padding
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        with torch.autocast(x.device.type, enabled=False):
            for start in range(0, x.shape[0], rows):
                chunk = slice(start, start + rows)
                total += _chunk_terms(x[chunk], y[chunk])[3] @ keep[chunk]
        ctx.save_for_backward(x, y, keep)
        ctx.rows = rows
        return total

    @staticmethod
    def backward(ctx, grad_total):
        x, y, keep = ctx.saved_tensors
        grad_x, grad_y = torch.empty_like(x), torch.empty_like(y)  # (N, V) each, in the logits' dtype
        with torch.autocast(x.device.type, enabled=False):
            for start in range(0, x.shape[0], ctx.rows):
                chunk = slice(start, start + ctx.rows)
                p, q, d, _ = _chunk_terms(x[chunk], y[chunk])
                scale = (keep[chunk] * grad_total)[:, None]  # (n_c, 1)
                grad_x[chunk] = (p * (d - (p * d).sum(-1, keepdim=True)) + (p - q)) * scale
                grad_y[chunk] = (q * ((q * d).sum(-1, keepdim=True) - d) + (q - p)) * scale
        return grad_x, grad_y, None, None


def symmetric_kl(first: Tensor, second: Tensor, labels: Tensor, pad_id: int,
                 chunk_elements: int | None = None) -> Tensor:
    """KL(P1 || P2) + KL(P2 || P1) summed over the non-pad target positions, P1 = softmax(first), P2 =
    softmax(second): first, second (B, T, V) logits of the same batch under two dropout masks, labels (B, T) ->
    a float32 scalar, differentiable in both logits. ``chunk_elements`` as the loss's (loss.py)."""
    if first.shape != second.shape:
        raise ValueError(f"the two passes' logits differ in shape: {tuple(first.shape)} and {tuple(second.shape)}")
    vocab = first.shape[-1]
    rows = chunk_rows(vocab, first.device.type, chunk_elements)
    keep = (labels.reshape(-1) != pad_id).float()  # (N,)
    return _SymmetricKL.apply(first.reshape(-1, vocab), second.reshape(-1, vocab), keep, rows)


def two_passes(src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
    """The batch stacked on itself, (B, S) -> (2B, S) and (B, T) -> (2B, T): one forward, two dropout masks."""
    return torch.cat([src, src]), torch.cat([tgt_in, tgt_in])
