"""Hand-written attention: "Attention Is All You Need", sections 3.2.1 and 3.2.2.

Three interchangeable kernels compute softmax(Q K^T / sqrt(d_k)) V:

- ``plain`` (the reference): matmul, mask, max-subtracted softmax, matmul. It is the only one
  that can return the attention weights, so every call that asks for them runs it.
- ``blocked``: walks over blocks of keys with an online softmax (a running max, a running sum
  of exponentials and a running weighted sum of values, all three in fp32), so the full
  ``Lq x Lk`` score matrix never exists, neither in the forward nor in the backward pass (the
  backward recomputes each block from the saved fp32 log-sum-exp).
- ``fused``: torch's ``F.scaled_dot_product_attention``. Causal self-attention reaches it with
  ``is_causal=True`` and no mask, the form for which PyTorch may pick its Flash kernel; padding
  reaches it as a (B, 1, 1, Lk) key mask, never a materialised (B, 1, Lq, Lk) one.

``auto`` (the default) picks per call (``choose_kernel``): ``plain`` when weights are asked for
(attention maps, analysis), else by device and dtype (``auto_kernel``): ``fused`` on CUDA and on CPU in
fp32, ``plain`` on CPU in bf16, each the kernel measured faster there.

Masks are boolean, True = "this query may attend to this key", broadcastable to
``(..., Lq, Lk)``; ``is_causal=True`` adds "query i sees keys <= i" (as many queries as keys).
A query row that can see no key at all yields zeros in both the output and the weights (never
NaN, never uniform weights over padding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_nmt.model.dropout import dropout

ATTENTION_KERNELS = ("auto", "plain", "blocked", "fused")


def head_dims(d_model: int, n_heads: int, d_k: int | None = None, d_v: int | None = None) -> tuple[int, int]:
    """(d_k, d_v) of one head (3.2.2): each as given, or d_model / h when None (the paper's base, and row A)."""
    return (d_k or d_model // n_heads), (d_v or d_model // n_heads)


def check_attention(d_model: int, n_heads: int, kernel: str | None = None, prefix: str = "",
                    error: type[Exception] = ValueError, d_k: int | None = None, d_v: int | None = None) -> None:
    """The one check of the attention settings (3.2.2): a d_k or d_v left to its default d_model / h needs that
    to be whole; one that is set must be >= 1; the kernel must be known. ``prefix`` names the options as the
    caller's user writes them (``"model."``)."""
    if n_heads < 1:
        raise error(f"{prefix}n_heads must be >= 1, got {n_heads}")
    for name, value in (("d_k", d_k), ("d_v", d_v)):
        if value is not None and value < 1:
            raise error(f"{prefix}{name} must be >= 1 (or null: d_model / n_heads), got {value}")
    if (d_k is None or d_v is None) and d_model % n_heads:
        unset = " and ".join(name for name, value in (("d_k", d_k), ("d_v", d_v)) if value is None)
        raise error(f"{prefix}d_model ({d_model}) must be divisible by {prefix}n_heads ({n_heads}): "
                    f"each head gets d_model / n_heads dimensions (or set {prefix}{unset} explicitly)")
    if kernel is not None and kernel not in ATTENTION_KERNELS:
        raise error(f"{prefix}attention must be one of {ATTENTION_KERNELS}, got {kernel!r}")


LOW_PRECISION = (torch.bfloat16, torch.float16)


def auto_kernel(device_type: str, dtype: torch.dtype) -> tuple[str, str]:
    """(the kernel ``auto`` runs where no weights are asked for, why), by device and the dtype the
    projections give (bf16 under bf16 autocast); each is the kernel benchmarks/benchmark_model.py measured faster
    there (docs/benchmarks.md, "Attention kernels" and "The model against nn.Transformer"):

    - CUDA: ``fused``, the only kernel that can reach Flash.
    - CPU, fp32: ``fused``, faster than ``plain`` in training steps and in cached decoding steps.
    - CPU, bf16 or fp16: ``plain``: torch's CPU SDPA under bf16 autocast is the slowest kernel there.
    """
    if device_type == "cpu" and dtype in LOW_PRECISION:
        return "plain", f"auto: plain on CPU in {str(dtype).removeprefix('torch.')} (torch's SDPA is slower there)"
    return "fused", f"auto: fused (torch's SDPA) on {device_type} in {str(dtype).removeprefix('torch.')}"


def choose_kernel(kernel: str, device_type: str, need_weights: bool, dtype: torch.dtype = torch.float32) -> str:
    """The kernel one call runs. Weights exist only in ``plain``; otherwise an explicit choice is kept, and
    ``auto`` follows ``auto_kernel`` for the device and the dtype of the call's queries."""
    if need_weights:
        return "plain"
    if kernel != "auto":
        return kernel
    return auto_kernel(device_type, dtype)[0]


def causal_mask(length: int, device=None) -> Tensor:
    """(length, length) bool, True on and below the diagonal: position i sees positions <= i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query and key must share d_k, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"key and value must have the same length, got {k.shape[-2]} and {v.shape[-2]}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"empty sequence: query length {q.shape[-2]}, key length {k.shape[-2]}")
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"is_causal needs as many queries as keys, got {q.shape[-2]} and {k.shape[-2]}: "
                         f"a step that extends a cache passes an explicit mask instead")


def _with_causal(mask: Tensor | None, q: Tensor, is_causal: bool) -> Tensor | None:
    """``mask`` AND "query i sees keys <= i" when ``is_causal``: (Lq, Lk) or broadcast with ``mask``."""
    if not is_causal:
        return mask
    causal = causal_mask(q.shape[-2], q.device)  # (L, L)
    return causal if mask is None else mask & causal


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """Section 3.2.1: softmax(Q K^T / sqrt(d_k)) V, written out step by step.

    q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v), mask bool broadcastable to
    (..., Lq, Lk) with True = may attend. Returns (out (..., Lq, d_v), weights (..., Lq, Lk)).
    ``dropout_p`` drops attention weights (pass 0.0 at evaluation).
    """
    _check_qkv(q, k, v, is_causal)
    mask = _with_causal(mask, q, is_causal)
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
    dropped = dropout(weights, dropout_p)
    return dropped @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)


def _stats_dtype(x: Tensor) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 inputs (float64 stays float64): the dtype of scores and softmax statistics."""
    return torch.promote_types(x.dtype, torch.float32)


def _block_scores(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, start: int, stop: int) -> Tensor:
    """Scaled scores of all queries against keys start:stop, in fp32, masked: (..., Lq, block)."""
    scores = (q @ k[..., start:stop, :].transpose(-2, -1)).to(_stats_dtype(q)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores.masked_fill(~mask[..., start:stop], float("-inf"))
    if is_causal:  # key j is visible to query i iff j <= i
        rows = torch.arange(q.shape[-2], device=q.device)[:, None]  # (Lq, 1)
        cols = torch.arange(start, stop, device=q.device)[None, :]  # (1, block)
        scores = scores.masked_fill(cols > rows, float("-inf"))
    return scores


class _BlockedAttention(torch.autograd.Function):
    """Online-softmax attention over key blocks, with a backward that recomputes each block.

    Forward keeps, per query row, a running max m, a running sum of exponentials l and a
    running weighted sum of values o; each new block rescales l and o by exp(m - m_new).
    Only the log-sum-exp per row (m + log l) is saved for the backward pass, so neither pass
    holds more than one (Lq x block) slice of scores at a time.

    Precision: the matrix products run in the inputs' dtype (bf16 under mixed precision); the
    scores, m, l, o and the log-sum-exp are fp32. Autocast is off inside both passes, so the
    backward recomputes exactly the scores the forward normalised: the guarantee that
    ``torch.amp.custom_fwd`` / ``custom_bwd`` give for one device type fixed at definition, here
    for whatever device the tensors are on.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, block_size: int, is_causal: bool):
        with torch.autocast(q.device.type, enabled=False):
            lq, lk = q.shape[-2], k.shape[-2]
            batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
            fp32 = _stats_dtype(q)
            tiny = torch.finfo(fp32).tiny
            running_max = q.new_full((*batch_shape, lq, 1), float("-inf"), dtype=fp32)  # m
            running_sum = q.new_zeros((*batch_shape, lq, 1), dtype=fp32)  # l
            running_out = q.new_zeros((*batch_shape, lq, v.shape[-1]), dtype=fp32)  # o
            for start in range(0, lk, block_size):
                stop = min(start + block_size, lk)
                scores = _block_scores(q, k, mask, is_causal, start, stop)  # (..., Lq, block) fp32
                new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
                safe_max = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
                rescale = torch.exp(running_max - safe_max)  # exp(m - m'); 0 while m is -inf
                exp_scores = torch.exp(scores - safe_max)  # (..., Lq, block)
                running_sum = running_sum * rescale + exp_scores.sum(dim=-1, keepdim=True)
                running_out = running_out * rescale + exp_scores.to(v.dtype) @ v[..., start:stop, :]
                running_max = new_max
            visible = running_sum > 0  # rows that saw at least one key
            out = torch.where(visible, running_out / running_sum.clamp_min(tiny), 0.0).to(q.dtype)
            safe_max = torch.where(torch.isfinite(running_max), running_max, torch.zeros_like(running_max))
            log_sum_exp = torch.where(visible, safe_max + torch.log(running_sum.clamp_min(tiny)),
                                      float("inf"))  # (..., Lq, 1) fp32; exp(s - inf) = 0 for empty rows
        ctx.save_for_backward(q, k, v, out, log_sum_exp, mask if mask is not None else torch.empty(0))
        ctx.has_mask, ctx.block_size, ctx.is_causal = mask is not None, block_size, is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, log_sum_exp, mask = ctx.saved_tensors
        mask = mask if ctx.has_mask else None
        scale = 1.0 / math.sqrt(q.shape[-1])
        with torch.autocast(q.device.type, enabled=False):
            grad_out = grad_out.to(q.dtype)
            # d softmax: dS = P * (dP - rowsum(dO * O)), with P recomputed block by block in fp32.
            fp32 = _stats_dtype(q)
            delta = (grad_out.to(fp32) * out.to(fp32)).sum(dim=-1, keepdim=True)  # (..., Lq, 1)
            grad_q = grad_out.new_zeros((*grad_out.shape[:-1], q.shape[-1]), dtype=fp32)
            grad_k_blocks, grad_v_blocks = [], []
            for start in range(0, k.shape[-2], ctx.block_size):
                stop = min(start + ctx.block_size, k.shape[-2])
                k_block, v_block = k[..., start:stop, :], v[..., start:stop, :]
                probs = torch.exp(_block_scores(q, k, mask, ctx.is_causal, start, stop) - log_sum_exp)
                grad_v_blocks.append(probs.to(v.dtype).transpose(-2, -1) @ grad_out)  # (..., block, d_v)
                grad_probs = (grad_out @ v_block.transpose(-2, -1)).to(fp32)  # (..., Lq, block)
                grad_scores = (probs * (grad_probs - delta) * scale).to(q.dtype)
                grad_q = grad_q + grad_scores @ k_block  # accumulated over blocks in fp32
                grad_k_blocks.append(grad_scores.transpose(-2, -1) @ q)  # (..., block, d_k)
        grad_k = _sum_to_shape(torch.cat(grad_k_blocks, dim=-2), k.shape)
        grad_v = _sum_to_shape(torch.cat(grad_v_blocks, dim=-2), v.shape)
        return _sum_to_shape(grad_q.to(q.dtype), q.shape), grad_k, grad_v, None, None, None


def _sum_to_shape(grad: Tensor, shape: torch.Size) -> Tensor:
    """Undo broadcasting: sum a gradient over the axes that were broadcast."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis, keepdim=True)
    return grad


def blocked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, block_size: int = 128,
                      is_causal: bool = False) -> Tensor:
    """Memory-efficient attention: equal to ``scaled_dot_product_attention(...)[0]`` without
    ever holding the (Lq x Lk) score matrix (nor, with ``is_causal``, an Lq x Lk mask).
    Returns out (..., Lq, d_v) in q's dtype."""
    _check_qkv(q, k, v, is_causal)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-2], q.shape[-2], k.shape[-2])  # a view: no copy
    k, v = k.to(q.dtype), v.to(q.dtype)  # one dtype for the products (autocast is off inside)
    return _BlockedAttention.apply(q, k, v, mask, block_size, is_causal)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0,
                    is_causal: bool = False) -> Tensor:
    """torch's fused SDPA kernel with our contract: rows with no visible key give zeros.

    Without a mask the call is ``F.scaled_dot_product_attention(q, k, v, is_causal=...)``, which may run
    Flash. A mask (e.g. (B, 1, 1, Lk) key padding) is passed as it broadcasts, never expanded."""
    _check_qkv(q, k, v, is_causal)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)
    mask = _with_causal(mask, q, is_causal)  # SDPA takes a mask or is_causal, not both
    # Let key-less rows attend everywhere (so no kernel sees an all-masked row: some return NaN
    # there), then zero them. (..., Lq or 1, 1): a (B, 1, 1, Lk) mask stays (B, 1, 1, Lk).
    no_key = ~mask.any(dim=-1, keepdim=True)
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
        self.v: Tensor | None = None  # (B, h, L, d_v)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` (beam search reorders hypotheses each step)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """Section 3.2.2: h heads attend in parallel, each with queries and keys of d_k features and values of d_v
    (both d_model / h unless given: Table 3, row B sets d_k apart).

    Batch-first: query (B, Lq, d_model), key/value (B, Lk, d_model). ``mask`` is bool,
    True = may attend, broadcastable to (B, h, Lq, Lk); ``is_causal`` adds "query i sees keys
    <= i" without building a mask. Returns (out (B, Lq, d_model), weights (B, h, Lq, Lk) per head
    when ``need_weights`` else None).

    W_Q (h d_k x d_model), W_K (h d_k x d_model) and W_V (h d_v x d_model) are stacked in one parameter,
    ``in_proj``, in that order (as in nn.MultiheadAttention, whose layout it is when d_k = d_v = d_model / h);
    ``q_proj``, ``k_proj`` and ``v_proj`` apply one of them. W_O (``out_proj``) maps h d_v back to d_model.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 kernel: str = "auto", block_size: int = 128, d_k: int | None = None, d_v: int | None = None,
                 rotary: nn.Module | None = None):
        super().__init__()
        check_attention(d_model, n_heads, kernel, d_k=d_k, d_v=d_v)
        self.d_model, self.n_heads = d_model, n_heads
        self.d_k, self.d_v = head_dims(d_model, n_heads, d_k, d_v)
        self.proj_sizes = (n_heads * self.d_k, n_heads * self.d_k, n_heads * self.d_v)  # rows of W_Q, W_K, W_V
        self.dropout, self.kernel, self.block_size = dropout, kernel, block_size
        # [W_Q; W_K; W_V]: (2 h d_k + h d_v, d_model)
        self.in_proj = nn.Linear(d_model, sum(self.proj_sizes), bias=bias)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model, bias=bias)  # W_O: (d_model, h d_v)
        # Self-attention's rotation of queries and keys by position (model/positions.py), shared by every layer;
        # None: positions are added to the embeddings, or this is cross-attention.
        self.rotary = rotary

    def init_weights(self) -> None:
        """Xavier per matrix (W_Q, W_K, W_V one by one, though ``in_proj`` stacks them; W_O), biases 0."""
        for matrix in self.in_proj.weight.split(self.proj_sizes):
            nn.init.xavier_uniform_(matrix)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for linear in (self.in_proj, self.out_proj):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, -1).transpose(1, 2)  # (B, L, h*d) -> (B, h, L, d), d = d_k or d_v

    def merge_heads(self, x: Tensor) -> Tensor:
        B, _, L, _ = x.shape
        return x.transpose(1, 2).contiguous().view(B, L, -1)  # (B, h, L, d_v) -> (B, L, h*d_v)

    def _project(self, x: Tensor, first: int, count: int) -> Tensor:
        """x (B, L, d_model) times ``count`` of [W_Q, W_K, W_V] from index ``first`` -> (B, L, their rows).
        The weight rows are a slice, i.e. a view of ``in_proj``: nothing is concatenated or copied."""
        rows = slice(sum(self.proj_sizes[:first]), sum(self.proj_sizes[:first + count]))
        bias = None if self.in_proj.bias is None else self.in_proj.bias[rows]
        return F.linear(x, self.in_proj.weight[rows], bias)

    def q_proj(self, x: Tensor) -> Tensor:
        return self._project(x, 0, 1)  # Q = x W_Q  (B, L, h d_k)

    def k_proj(self, x: Tensor) -> Tensor:
        return self._project(x, 1, 1)  # K = x W_K  (B, L, h d_k)

    def v_proj(self, x: Tensor) -> Tensor:
        return self._project(x, 2, 1)  # V = x W_V  (B, L, h d_v)

    def project_qkv(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q = query W_Q, K = key W_K, V = value W_V, as one matrix product where inputs are shared:
        one (d_model x (2 h d_k + h d_v)) product for self-attention, one (d_model x (h d_k + h d_v)) for K, V."""
        if query is key and key is value:
            return self.in_proj(query).split(self.proj_sizes, dim=-1)  # (B, L, h d_k) x 2, (B, L, h d_v)
        if key is value:
            k, v = self._project(key, 1, 2).split(self.proj_sizes[1:], dim=-1)
        else:
            k, v = self.k_proj(key), self.v_proj(value)
        return self.q_proj(query), k, v

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
                is_causal: bool = False, need_weights: bool = False,
                cache: AttentionCache | None = None) -> tuple[Tensor, Tensor | None]:
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"query must be (B, L, {self.d_model}), got {tuple(query.shape)}")
        if cache is not None and cache.static and cache.k is not None:
            q = self.split_heads(self.q_proj(query))  # (B, h, Lq, d_k)
            k, v = cache.k, cache.v  # source keys/values, projected on the first step
        else:
            q, k, v = (self.split_heads(x) for x in self.project_qkv(query, key, value))  # (B, h, L, d_k or d_v)
            if self.rotary is not None:  # new queries and keys sit after the cached ones; cached keys are rotated
                offset = len(cache) if cache is not None else 0
                q, k = self.rotary(q, offset), self.rotary(k, offset)
            if cache is not None:
                if not cache.static and cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)  # (B, h, t, d_k)
                    v = torch.cat([cache.v, v], dim=2)  # (B, h, t, d_v)
                cache.k, cache.v = k, v

        dropout_p = self.dropout if self.training else 0.0
        kernel = choose_kernel(self.kernel, q.device.type, need_weights, q.dtype)
        if kernel == "plain":
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal)  # (B, h, Lq, d_v)
        elif kernel == "blocked":
            if dropout_p > 0:
                raise ValueError("the blocked attention kernel does not apply attention dropout; "
                                 "set model.attention_dropout=0 or model.attention=plain")
            out = blocked_attention(q, k, v, mask, self.block_size, is_causal)
        else:
            out = fused_attention(q, k, v, mask, dropout_p, is_causal)
        return self.out_proj(self.merge_heads(out)), (weights if need_weights else None)
