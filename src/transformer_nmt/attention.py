"""Hand-written attention: "Attention Is All You Need", sections 3.2.1 and 3.2.2.

Three interchangeable kernels compute softmax(Q K^T / sqrt(d_k)) V:

- ``plain`` (the default and the reference): matmul, mask, max-subtracted softmax,
  matmul. It is the only one that can return the attention weights.
- ``blocked``: walks over blocks of keys with an online softmax (a running max, a
  running sum of exponentials and a running weighted sum of values), so the full
  ``Lq x Lk`` score matrix never exists, neither in the forward nor in the backward
  pass (the backward recomputes each block from the saved log-sum-exp).
- ``fused``: torch's ``F.scaled_dot_product_attention`` kernel, for speed; tested
  equal to ``plain``.

Masks are boolean, True = "this query may attend to this key", broadcastable to
``(..., Lq, Lk)``. A query row that can see no key at all yields zeros in both the
output and the weights (never NaN, never uniform weights over padding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_KERNELS = ("plain", "blocked", "fused")


def causal_mask(length: int, device=None) -> Tensor:
    """(length, length) bool, True on and below the diagonal: position i sees positions <= i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query and key must share d_k, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"key and value must have the same length, got {k.shape[-2]} and {v.shape[-2]}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"empty sequence: query length {q.shape[-2]}, key length {k.shape[-2]}")


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Section 3.2.1: softmax(Q K^T / sqrt(d_k)) V, written out step by step.

    q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v), mask bool broadcastable to
    (..., Lq, Lk) with True = may attend. Returns (out (..., Lq, d_v), weights (..., Lq, Lk)).
    ``dropout_p`` drops attention weights (pass 0.0 at evaluation).
    """
    _check_qkv(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Lq, Lk)
    scores = scores.float()  # the softmax runs in fp32 even under bf16/fp16 autocast
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # mask before the softmax
    # Stable softmax: subtract each row's max. A row with no visible key has max -inf;
    # use 0 there so exp(-inf - 0) = 0 and the row comes out all zeros instead of NaN.
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp_scores = torch.exp(scores - row_max)
    row_sum = exp_scores.sum(dim=-1, keepdim=True)
    weights = exp_scores / row_sum.clamp_min(torch.finfo(row_sum.dtype).tiny)  # (..., Lq, Lk)
    weights = weights.to(v.dtype)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return dropped @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)


class _BlockedAttention(torch.autograd.Function):
    """Online-softmax attention over key blocks, with a backward that recomputes each block.

    Forward keeps, per query row, a running max m, a running sum of exponentials l and a
    running weighted sum of values o; each new block rescales l and o by exp(m - m_new).
    Only the log-sum-exp per row (m + log l) is saved for the backward pass, so neither pass
    holds more than one (Lq x block) slice of scores at a time.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, block_size: int):
        scale = 1.0 / math.sqrt(q.shape[-1])
        lq, lk = q.shape[-2], k.shape[-2]
        batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        running_max = q.new_full((*batch_shape, lq, 1), float("-inf"))
        running_sum = q.new_zeros((*batch_shape, lq, 1))
        running_out = q.new_zeros((*batch_shape, lq, v.shape[-1]))
        for start in range(0, lk, block_size):
            stop = min(start + block_size, lk)
            scores = (q @ k[..., start:stop, :].transpose(-2, -1)) * scale  # (..., Lq, block)
            if mask is not None:
                scores = scores.masked_fill(~mask[..., start:stop], float("-inf"))
            new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
            safe_max = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
            rescale = torch.exp(running_max - safe_max)  # exp(m - m'); 0 while m is -inf
            exp_scores = torch.exp(scores - safe_max)  # (..., Lq, block)
            running_sum = running_sum * rescale + exp_scores.sum(dim=-1, keepdim=True)
            running_out = running_out * rescale + exp_scores @ v[..., start:stop, :]
            running_max = new_max
        visible = running_sum > 0  # rows that saw at least one key
        out = torch.where(visible, running_out / running_sum.clamp_min(torch.finfo(q.dtype).tiny), 0.0)
        safe_max = torch.where(torch.isfinite(running_max), running_max, torch.zeros_like(running_max))
        log_sum_exp = torch.where(visible, safe_max + torch.log(running_sum.clamp_min(torch.finfo(q.dtype).tiny)),
                                  torch.full_like(running_sum, float("inf")))  # exp(s - inf) = 0 for empty rows
        ctx.save_for_backward(q, k, v, out, log_sum_exp, mask if mask is not None else torch.empty(0))
        ctx.has_mask = mask is not None
        ctx.block_size = block_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, log_sum_exp, mask = ctx.saved_tensors
        mask = mask if ctx.has_mask else None
        scale = 1.0 / math.sqrt(q.shape[-1])
        # d softmax: dS = P * (dP - rowsum(dO * O)), with P recomputed block by block.
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., Lq, 1)
        grad_q = grad_out.new_zeros((*grad_out.shape[:-1], q.shape[-1]))  # (..., Lq, d_k)
        grad_k_blocks, grad_v_blocks = [], []
        for start in range(0, k.shape[-2], ctx.block_size):
            stop = min(start + ctx.block_size, k.shape[-2])
            k_block, v_block = k[..., start:stop, :], v[..., start:stop, :]
            scores = (q @ k_block.transpose(-2, -1)) * scale
            if mask is not None:
                scores = scores.masked_fill(~mask[..., start:stop], float("-inf"))
            probs = torch.exp(scores - log_sum_exp)  # (..., Lq, block)
            grad_v_blocks.append(probs.transpose(-2, -1) @ grad_out)
            grad_scores = probs * (grad_out @ v_block.transpose(-2, -1) - delta) * scale
            grad_q = grad_q + grad_scores @ k_block
            grad_k_blocks.append(grad_scores.transpose(-2, -1) @ q)
        grad_k = _sum_to_shape(torch.cat(grad_k_blocks, dim=-2), k.shape)
        grad_v = _sum_to_shape(torch.cat(grad_v_blocks, dim=-2), v.shape)
        return _sum_to_shape(grad_q, q.shape), grad_k, grad_v, None, None


def _sum_to_shape(grad: Tensor, shape: torch.Size) -> Tensor:
    """Undo broadcasting: sum a gradient over the axes that were broadcast."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis, keepdim=True)
    return grad


def blocked_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, block_size: int = 128
) -> Tensor:
    """Memory-efficient attention: equal to ``scaled_dot_product_attention(...)[0]`` without
    ever holding the (Lq x Lk) score matrix. Returns out (..., Lq, d_v)."""
    _check_qkv(q, k, v)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-2], q.shape[-2], k.shape[-2])
    return _BlockedAttention.apply(q, k, v, mask, block_size)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """torch's fused SDPA kernel with our contract: rows with no visible key give zeros."""
    _check_qkv(q, k, v)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    # Let key-less rows attend everywhere (so the kernel sees no all-masked row), then zero them.
    no_key = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | no_key, dropout_p=dropout_p)
    return out.masked_fill(no_key, 0.0)


class AttentionCache:
    """Keys and values of one attention layer kept across decoding steps.

    Self-attention (``static=False``): each step appends its new keys/values, so step t
    costs O(t). Cross-attention (``static=True``): the keys/values of the source are
    projected on the first step and reused after that.
    """

    def __init__(self, static: bool):
        self.static = static
        self.k: Tensor | None = None  # (B, h, L, d_k)
        self.v: Tensor | None = None  # (B, h, L, d_k)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` (beam search reorders hypotheses each step)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """Section 3.2.2: h heads attend in parallel, each on d_k = d_model / h features.

    Batch-first: query (B, Lq, d_model), key/value (B, Lk, d_model). ``mask`` is bool,
    True = may attend, broadcastable to (B, h, Lq, Lk). Returns (out (B, Lq, d_model),
    weights (B, h, Lq, Lk) per head when ``need_weights`` else None).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 kernel: str = "plain", block_size: int = 128):
        super().__init__()
        if n_heads < 1 or d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention kernel must be one of {ATTENTION_KERNELS}, got {kernel!r}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.dropout, self.kernel, self.block_size = dropout, kernel, block_size
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        # Per-head gate (h,), 1 = keep, 0 = silence the head (head-importance analysis); None = all on.
        self.register_buffer("head_gates", None, persistent=False)

    def split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, L, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        B, _, L, _ = x.shape
        return x.transpose(1, 2).contiguous().view(B, L, self.d_model)  # (B, L, h*d_k)

    def project_qkv(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q = query W_Q, K = key W_K, V = value W_V, as one matrix product where inputs are shared:
        one (d_model x 3 d_model) product for self-attention, one (d_model x 2 d_model) for K, V."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if query is key and key is value:
            groups = [(query, projections)]
        elif key is value:
            groups = [(query, projections[:1]), (key, projections[1:])]
        else:
            groups = [(x, (p,)) for x, p in zip((query, key, value), projections)]
        outputs = []
        for x, linears in groups:
            if len(linears) == 1:
                outputs.append(linears[0](x))
                continue
            weight = torch.cat([p.weight for p in linears])  # (n * d_model, d_model)
            bias = torch.cat([p.bias for p in linears]) if linears[0].bias is not None else None
            outputs.extend(F.linear(x, weight, bias).split(self.d_model, dim=-1))  # n x (B, L, d_model)
        return tuple(outputs)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
                need_weights: bool = False, cache: AttentionCache | None = None) -> tuple[Tensor, Tensor | None]:
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"query must be (B, L, {self.d_model}), got {tuple(query.shape)}")
        if cache is not None and cache.static and cache.k is not None:
            q = self.split_heads(self.q_proj(query))  # (B, h, Lq, d_k)
            k, v = cache.k, cache.v  # source keys/values, projected on the first step
        else:
            q, k, v = (self.split_heads(x) for x in self.project_qkv(query, key, value))  # (B, h, L, d_k) each
            if cache is not None:
                if not cache.static and cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)  # (B, h, t, d_k)
                    v = torch.cat([cache.v, v], dim=2)
                cache.k, cache.v = k, v

        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights or self.kernel == "plain":
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)  # (B, h, Lq, d_k)
        elif self.kernel == "blocked":
            if dropout_p > 0:
                raise ValueError("the blocked attention kernel does not apply attention dropout; "
                                 "set model.attention_dropout=0 or model.attention=plain")
            out = blocked_attention(q, k, v, mask, self.block_size)
        else:
            out = fused_attention(q, k, v, mask, dropout_p)
        if self.head_gates is not None:
            out = out * self.head_gates.view(1, -1, 1, 1)  # silence gated heads
        return self.out_proj(self.merge_heads(out)), (weights if need_weights else None)
