"""The hand-written attention: its invariants (docs/model.md, "Kernels and masks") and equality with torch's
own kernels."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_nmt.model.attention as attention_module
from transformer_nmt.model.attention import (
    AttentionCache,
    MultiHeadAttention,
    blocked_attention,
    causal_mask,
    check_attention,
    choose_kernel,
    fused_attention,
    scaled_dot_product_attention,
)

TOL = dict(atol=1e-5, rtol=1e-5)


def assert_close_bf16(got, expected, name=""):
    """bf16 keeps 8 significant bits (one step is 0.4-0.8% of a value), and kernels round in different
    places: equal within 1% of the tensor's largest magnitude."""
    torch.testing.assert_close(got, expected, atol=1e-2 * expected.abs().max().item(), rtol=0, msg=name or None)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def padding_mask(lengths, max_len):
    """(B,) lengths -> (B, 1, 1, max_len) bool, True at real keys."""
    return (torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def random_qkv(B=2, h=3, Lq=5, Lk=7, d=8, requires_grad=False):
    q, k, v = (torch.randn(B, h, L, d, requires_grad=requires_grad) for L in (Lq, Lk, Lk))
    return q, k, v


# --- invariants -------------------------------------------------------------------------------

def test_rows_sum_to_one_and_are_non_negative():
    q, k, v = random_qkv()
    mask = padding_mask([7, 4], 7)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5), **TOL)


def test_masked_positions_are_exactly_zero():
    q, k, v = random_qkv()
    mask = padding_mask([7, 4], 7)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert (weights[1, :, :, 4:] == 0).all()
    assert (weights[1, :, :, :4] > 0).all()


def test_causal_mask_row_zero_sees_only_itself():
    q, k, v = random_qkv(Lq=6, Lk=6)
    out, weights = scaled_dot_product_attention(q, k, v, causal_mask(6))
    assert (weights[..., 0, 0] == 1).all()
    assert (weights[..., 0, 1:] == 0).all()
    assert (weights.triu(diagonal=1) == 0).all()
    torch.testing.assert_close(out[..., 0, :], v[..., 0, :], **TOL)


def test_all_zero_scores_give_uniform_weights_over_visible_keys():
    q = torch.zeros(2, 1, 3, 4)
    k = torch.randn(2, 1, 6, 4)
    v = torch.randn(2, 1, 6, 4)
    _, weights = scaled_dot_product_attention(q, k, v, padding_mask([6, 4], 6))
    torch.testing.assert_close(weights[0], torch.full((1, 3, 6), 1 / 6), **TOL)
    torch.testing.assert_close(weights[1, :, :, :4], torch.full((1, 3, 4), 1 / 4), **TOL)
    assert (weights[1, :, :, 4:] == 0).all()


def test_zero_input_without_bias_gives_uniform_weights():
    mha = MultiHeadAttention(16, 4, bias=False)
    x = torch.zeros(1, 5, 16)
    _, weights = mha(x, x, x, need_weights=True)
    torch.testing.assert_close(weights, torch.full((1, 4, 5, 5), 0.2), **TOL)


def test_huge_logits_stay_finite():
    q = torch.full((1, 1, 2, 4), 100.0)
    k = torch.full((1, 1, 3, 4), 100.0)  # scores of 1e4 * 4 / 2 = 2e4
    k[..., 0, :] = -100.0
    v = torch.randn(1, 1, 3, 4)
    out, weights = scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(weights[0, 0, 0], torch.tensor([0.0, 0.5, 0.5]), **TOL)


@pytest.mark.parametrize("kernel", ["plain", "blocked", "fused"])
def test_fully_masked_row_gives_zeros_and_no_nan_in_forward_and_backward(kernel):
    q, k, v = random_qkv(requires_grad=True)
    mask = padding_mask([7, 0], 7)  # sample 1 has no visible key at all
    if kernel == "plain":
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        assert (weights[1] == 0).all()
    elif kernel == "blocked":
        out = blocked_attention(q, k, v, mask, block_size=3)
    else:
        out = fused_attention(q, k, v, mask)
    assert (out[1] == 0).all()
    out.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[1] == 0).all()


def test_permutation_equivariance_without_positions():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 6, 16)
    perm = torch.randperm(6)
    out, weights = mha(x, x, x, need_weights=True)
    out_p, weights_p = mha(x[:, perm], x[:, perm], x[:, perm], need_weights=True)
    torch.testing.assert_close(out_p, out[:, perm], **TOL)
    torch.testing.assert_close(weights_p, weights[:, :, perm][:, :, :, perm], **TOL)


def test_shape_table_of_the_notes():
    mha = MultiHeadAttention(512, 8)
    x = torch.randn(2, 4, 512)
    assert mha.split_heads(mha.q_proj(x)).shape == (2, 8, 4, 64)
    out, weights = mha(x, x, x, need_weights=True)
    assert weights.shape == (2, 8, 4, 4)
    assert out.shape == (2, 4, 512)
    assert mha(x, x, x)[1] is None


@pytest.mark.parametrize("h", [1, 4])
def test_other_head_counts_run(h):
    mha = MultiHeadAttention(8, h)
    out, weights = mha(torch.randn(1, 3, 8), torch.randn(1, 3, 8), torch.randn(1, 3, 8), need_weights=True)
    assert out.shape == (1, 3, 8) and weights.shape == (1, h, 3, 3)


def test_indivisible_heads_raise_naming_both_numbers():
    with pytest.raises(ValueError, match=r"d_model \(4\).*n_heads \(3\)"):
        MultiHeadAttention(4, 3)


def test_empty_sequence_is_rejected():
    q, k, v = random_qkv(Lk=0)
    with pytest.raises(ValueError, match="empty sequence"):
        scaled_dot_product_attention(q, k, v)


def test_scaling_is_one_over_sqrt_dk():
    # One query against two keys: the weight ratio must be exp((s1 - s2) / sqrt(d_k)).
    d = 64
    q = torch.zeros(1, 1, d)
    q[0, 0, 0] = 1.0
    k = torch.zeros(1, 2, d)
    k[0, 0, 0] = 16.0
    _, weights = scaled_dot_product_attention(q, k, torch.randn(1, 2, 3))
    expected = torch.softmax(torch.tensor([16.0 / math.sqrt(d), 0.0]), -1)
    torch.testing.assert_close(weights[0, 0], expected, **TOL)


# --- equality with independent references ------------------------------------------------------

def test_equals_torch_sdpa_with_padding_and_causal_masks():
    q, k, v = random_qkv(Lq=6, Lk=6)
    mask = causal_mask(6) & padding_mask([6, 5], 6)  # (B, 1, 6, 6); no row is fully masked
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    out, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL)


def copy_to_torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.d_model, ours.n_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.in_proj.weight)  # both stack [W_Q; W_K; W_V]
        ref.in_proj_bias.copy_(ours.in_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref


@pytest.mark.parametrize("masking", ["padding", "causal"])
def test_equals_torch_multihead_attention_outputs_weights_and_gradients(masking):
    d, h, L = 32, 4, 6
    ours = MultiHeadAttention(d, h)
    ref = copy_to_torch_mha(ours)
    x = torch.randn(2, L, d)
    memory = torch.randn(2, L + 1, d)
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    m_ours, m_ref = memory.clone().requires_grad_(), memory.clone().requires_grad_()
    if masking == "padding":  # cross-attention onto a padded memory
        key_mask = padding_mask([L + 1, 3], L + 1)
        out, w = ours(x_ours, m_ours, m_ours, key_mask, need_weights=True)
        out_ref, w_ref = ref(x_ref, m_ref, m_ref, key_padding_mask=~key_mask[:, 0, 0],
                             need_weights=True, average_attn_weights=False)
    else:  # causal self-attention
        out, w = ours(x_ours, x_ours, x_ours, causal_mask(L), need_weights=True)
        out_ref, w_ref = ref(x_ref, x_ref, x_ref, attn_mask=~causal_mask(L),
                             need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, out_ref, **TOL)
    torch.testing.assert_close(w, w_ref, **TOL)

    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    (out_ref * grad).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, **TOL)
    if masking == "padding":
        torch.testing.assert_close(m_ours.grad, m_ref.grad, **TOL)
    torch.testing.assert_close(ours.in_proj.weight.grad, ref.in_proj_weight.grad, **TOL)
    torch.testing.assert_close(ours.in_proj.bias.grad, ref.in_proj_bias.grad, **TOL)
    torch.testing.assert_close(ours.out_proj.weight.grad, ref.out_proj.weight.grad, **TOL)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "padding_and_causal", "is_causal",
                                       "padding_and_is_causal"])
@pytest.mark.parametrize("block_size", [1, 4, 64])
def test_blocked_equals_plain_with_gradients(mask_kind, block_size):
    Lq = Lk = 9
    q, k, v = random_qkv(Lq=Lq, Lk=Lk, requires_grad=True)
    masks = {"none": None, "padding": padding_mask([9, 5], 9), "causal": causal_mask(9),
             "padding_and_causal": causal_mask(9) & padding_mask([9, 5], 9)}
    mask = masks.get(mask_kind.removesuffix("_and_is_causal"))  # is_causal: the reference gets the mask
    is_causal = mask_kind.endswith("is_causal")
    grad = torch.randn(2, 3, Lq, 8)
    out_plain, _ = scaled_dot_product_attention(q, k, v, causal_mask(9) & mask if is_causal and mask is not None
                                                else causal_mask(9) if is_causal else mask)
    grads_plain = torch.autograd.grad((out_plain * grad).sum(), (q, k, v))
    out_blocked = blocked_attention(q, k, v, mask, block_size=block_size, is_causal=is_causal)
    grads_blocked = torch.autograd.grad((out_blocked * grad).sum(), (q, k, v))
    torch.testing.assert_close(out_blocked, out_plain, **TOL)
    for g_blocked, g_plain in zip(grads_blocked, grads_plain):
        torch.testing.assert_close(g_blocked, g_plain, **TOL)


def test_blocked_gradients_pass_gradcheck_in_double():
    q, k, v = (t.double().detach().requires_grad_() for t in random_qkv(B=1, h=2, Lq=4, Lk=5, d=3))
    mask = padding_mask([4], 5)
    assert torch.autograd.gradcheck(lambda q, k, v: blocked_attention(q, k, v, mask, block_size=2), (q, k, v))


def test_blocked_never_materialises_the_full_score_matrix():
    # Record the largest storage created by any op during forward and backward (views share
    # their base's storage, so an expanded mask does not count as a new L x L tensor).
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestTensor(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor):
                    numel = t.untyped_storage().nbytes() // t.element_size()
                    LargestTensor.largest = max(LargestTensor.largest, numel)
            return out

    B, h, L, d, block = 1, 2, 256, 8, 16
    q, k, v = random_qkv(B=B, h=h, Lq=L, Lk=L, d=d, requires_grad=True)
    with LargestTensor():
        blocked_attention(q, k, v, padding_mask([L - 3], L), block_size=block).sum().backward()
    full_scores = B * h * L * L
    assert LargestTensor.largest < full_scores // 4, (LargestTensor.largest, full_scores)


def test_blocked_keeps_fp32_statistics_under_bf16():
    # q, k, v in bf16 (what the projections give under bf16 autocast). Both kernels round the scores'
    # products to bf16 alike; blocked then keeps m, l, o and the log-sum-exp in fp32, so it differs from
    # plain by accumulation order only. With those statistics in bf16 (the former version) the
    # backward's exp(scores - lse) was off by up to 2.5% of the largest gradient here.
    B, h, L, d = 2, 2, 64, 16
    q, k, v = 3 * torch.randn(B, h, L, d), torch.randn(B, h, L, d), torch.randn(B, h, L, d)
    mask, grad = padding_mask([L, 40], L), torch.randn(B, h, L, d)

    def run(kernel):
        inputs = [t.bfloat16().requires_grad_() for t in (q, k, v)]
        out = kernel(*inputs)
        assert out.dtype == torch.bfloat16
        return [out.float(), *(g.float() for g in torch.autograd.grad((out.float() * grad).sum(), inputs))]

    plain = run(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask)[0])
    blocked = run(lambda q, k, v: blocked_attention(q, k, v, mask, block_size=16))
    for name, b, p in zip(["out", "dq", "dk", "dv"], blocked, plain):
        assert_close_bf16(b, p, name)


MASKINGS = ["none", "padding", "causal_mask", "is_causal", "padding_and_is_causal", "cross_padding"]


def attend(mha, x, memory, masking):
    """One call of ``mha`` with the given masking: self-attention on x, or cross-attention onto memory."""
    L, S = x.shape[1], memory.shape[1]
    if masking == "cross_padding":
        return mha(x, memory, memory, padding_mask([S, 3], S))[0]
    mask = {"padding": padding_mask([L, 2], L), "causal_mask": causal_mask(L),
            "padding_and_is_causal": padding_mask([L, 4], L)}.get(masking)
    return mha(x, x, x, mask, is_causal=masking.endswith("is_causal"))[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("kernel", ["fused", "blocked", "auto"])
def test_every_kernel_equals_plain_outputs_and_gradients(kernel, masking, precision):
    d, h = 32, 4
    plain = MultiHeadAttention(d, h, kernel="plain")
    other = MultiHeadAttention(d, h, kernel=kernel, block_size=4)
    other.load_state_dict(plain.state_dict())
    x, memory, grad = torch.randn(2, 6, d), torch.randn(2, 7, d), torch.randn(2, 6, d)
    results = []
    for mha in (plain, other):
        x_, memory_ = x.clone().requires_grad_(), memory.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = attend(mha, x_, memory_, masking)
        inputs = [x_, memory_] if masking == "cross_padding" else [x_]
        grads = torch.autograd.grad((out.float() * grad).sum(), [*inputs, mha.in_proj.weight, mha.out_proj.weight])
        results.append([out.float(), *grads])
    for got, expected in zip(results[1], results[0]):
        if precision == "fp32":
            torch.testing.assert_close(got, expected, **TOL)
        else:
            assert_close_bf16(got, expected)


def test_choose_kernel():
    for kernel in ("auto", "plain", "blocked", "fused"):  # weights exist only in the hand-written kernel
        assert choose_kernel(kernel, "cpu", need_weights=True) == "plain"
        assert choose_kernel(kernel, "cuda", need_weights=True) == "plain"
    for kernel in ("plain", "blocked", "fused"):  # an explicit choice is kept
        assert choose_kernel(kernel, "cuda", need_weights=False) == kernel
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # on CUDA only fused can reach Flash
        assert choose_kernel("auto", "cuda", need_weights=False, dtype=dtype) == "fused"
    # on CPU, what benchmarks/benchmark_model.py measured faster: fused in fp32, plain under bf16 autocast
    assert choose_kernel("auto", "cpu", need_weights=False, dtype=torch.float32) == "fused"
    assert choose_kernel("auto", "cpu", need_weights=False, dtype=torch.bfloat16) == "plain"
    assert choose_kernel("auto", "cpu", need_weights=False, dtype=torch.float16) == "plain"


@pytest.mark.parametrize("precision, expected", [("fp32", "fused"), ("bf16", "plain")])
def test_auto_runs_the_kernel_of_the_calls_dtype(monkeypatch, precision, expected):
    """The dtype auto decides by is the one the projections give: bf16 under CPU autocast."""
    ran = []
    for name, kernel in (("fused_attention", "fused"), ("scaled_dot_product_attention", "plain")):
        real = getattr(attention_module, name)
        monkeypatch.setattr(attention_module, name, lambda *a, _real=real, _kernel=kernel, **k: (
            ran.append(_kernel), _real(*a, **k))[1])
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        out, weights = mha(x, x, x)
    assert ran == [expected] and weights is None and out.shape == (2, 5, 16)


def test_is_causal_with_fewer_queries_than_keys_is_refused():
    q, k, v = random_qkv(Lq=1, Lk=5)
    for kernel in (lambda *a, **kw: scaled_dot_product_attention(*a, **kw)[0], blocked_attention, fused_attention):
        with pytest.raises(ValueError, match="is_causal needs as many queries as keys"):
            kernel(q, k, v, is_causal=True)


def test_check_attention_names_the_options():
    with pytest.raises(ValueError, match=r"model.d_model \(30\) must be divisible by model.n_heads \(4\)"):
        check_attention(30, 4, prefix="model.")
    with pytest.raises(KeyError, match=r"attention must be one of"):
        check_attention(32, 4, "flash", error=KeyError)
    check_attention(32, 4, "auto")


def test_head_gate_silences_exactly_one_head():
    from transformer_nmt.analysis.head_gates import set_layer_gates

    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    set_layer_gates(mha, torch.tensor([1.0, 0.0, 1.0, 1.0]))  # a hook analysis attaches; the model has no gates
    out_gated, _ = mha(x, x, x)
    # Reference: zero that head's slice of the merged heads before W_O.
    q, k, v = (mha.split_heads(p(x)) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    heads, _ = scaled_dot_product_attention(q, k, v)
    heads[:, 1] = 0
    torch.testing.assert_close(out_gated, mha.out_proj(mha.merge_heads(heads)), **TOL)


# --- d_k and d_v apart from d_model / h (Table 3, row B) ------------------------------------------

def per_head_reference(mha: MultiHeadAttention, query, key, value, mask=None, is_causal=False):
    """Multi-head attention written head by head, without split_heads or merge_heads: head i projects with its
    own rows of W_Q, W_K (d_k each) and W_V (d_v), attends with torch's F.scaled_dot_product_attention, and
    enters the output through its own d_v columns of W_O: out = b_O + sum_i head_i W_O[:, i]^T."""
    h, d_k, d_v = mha.n_heads, mha.d_k, mha.d_v
    weight, bias = mha.in_proj.weight, mha.in_proj.bias
    out = mha.out_proj.bias
    for i in range(h):
        rows_q = slice(i * d_k, (i + 1) * d_k)
        rows_k = slice(h * d_k + i * d_k, h * d_k + (i + 1) * d_k)
        rows_v = slice(2 * h * d_k + i * d_v, 2 * h * d_k + (i + 1) * d_v)
        q = query @ weight[rows_q].T + bias[rows_q]  # (B, Lq, d_k)
        k = key @ weight[rows_k].T + bias[rows_k]  # (B, Lk, d_k)
        v = value @ weight[rows_v].T + bias[rows_v]  # (B, Lk, d_v)
        head = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)  # (B, Lq, d_v)
        out = out + head @ mha.out_proj.weight[:, i * d_v:(i + 1) * d_v].T
    return out  # (B, Lq, d_model)


@pytest.mark.parametrize("masking", ["is_causal", "cross_padding"])
@pytest.mark.parametrize("kernel", ["plain", "blocked", "fused"])
def test_d_k_and_d_v_apart_from_d_model_over_h_equal_a_per_head_reference(kernel, masking):
    d, h, d_k, d_v = 12, 3, 5, 7  # d_model / h would be 4
    mha = MultiHeadAttention(d, h, kernel=kernel, block_size=2, d_k=d_k, d_v=d_v)
    assert mha.in_proj.weight.shape == (2 * h * d_k + h * d_v, d) and mha.out_proj.weight.shape == (d, h * d_v)
    x, memory = torch.randn(2, 6, d, requires_grad=True), torch.randn(2, 7, d, requires_grad=True)
    if masking == "is_causal":
        out, _ = mha(x, x, x, is_causal=True)
        ref = per_head_reference(mha, x, x, x, is_causal=True)
        inputs = [x]
    else:
        mask = padding_mask([7, 3], 7)  # (B, 1, 1, 7)
        out, _ = mha(x, memory, memory, mask)
        ref = per_head_reference(mha, x, memory, memory, mask=mask[:, 0])  # (B, 1, 7) for 3-d inputs
        inputs = [x, memory]
    torch.testing.assert_close(out, ref, **TOL)
    grad = torch.randn_like(out)
    params = [*inputs, mha.in_proj.weight, mha.out_proj.weight]
    for got, expected in zip(torch.autograd.grad((out * grad).sum(), params),
                             torch.autograd.grad((ref * grad).sum(), params)):
        torch.testing.assert_close(got, expected, **TOL)


def test_d_k_apart_keeps_the_cache_and_the_weights_per_head():
    mha = MultiHeadAttention(8, 2, kernel="plain", d_k=3, d_v=5)
    x = torch.randn(1, 4, 8)
    full, weights = mha(x, x, x, causal_mask(4), need_weights=True)
    assert weights.shape == (1, 2, 4, 4)
    cache = AttentionCache(static=False)
    steps = [mha(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache)[0] for t in range(4)]
    assert cache.k.shape == (1, 2, 4, 3) and cache.v.shape == (1, 2, 4, 5)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)


def test_check_attention_needs_divisibility_only_for_dimensions_left_to_their_default():
    check_attention(30, 4, d_k=8, d_v=8)  # both set: d_model / h need not be whole
    with pytest.raises(ValueError, match=r"divisible by model.n_heads \(4\).*set model.d_v explicitly"):
        check_attention(30, 4, prefix="model.", d_k=8)
    with pytest.raises(ValueError, match=r"model.d_k must be >= 1"):
        check_attention(32, 4, prefix="model.", d_k=0)
