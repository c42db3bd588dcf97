"""dropout.py: the CPU mask drawn from integers keeps dropout's distribution and arithmetic."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_nmt.model.dropout import Dropout, dropout
from transformer_nmt.model.transformer import Transformer, TransformerConfig

N = 1_000_000


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.7])
def test_drop_rate_within_five_sigma_and_elements_of_one_draw_independent(p):
    torch.manual_seed(0)
    dropped = dropout(torch.ones(N), p) == 0  # (N,)
    sigma = math.sqrt(p * (1 - p) / N)
    assert abs(dropped.float().mean().item() - p) < 5 * sigma
    # One 64-bit draw gives four elements' 16-bit integers (p <= 0.5), or two elements' 32-bit ones (above):
    # any two of a draw's elements are both dropped with probability p^2, as any two elements.
    per_draw = 4 if p <= 0.5 else 2
    groups = dropped.view(-1, per_draw)  # (N / per_draw, per_draw): the elements of one draw
    for i in range(per_draw):
        for j in range(i + 1, per_draw):
            both = (groups[:, i] & groups[:, j]).float().mean().item()
            assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / len(groups)), (i, j)
    # Across the length, the rate does not drift (each tenth within five sigma of p).
    for part in dropped.view(10, -1):
        assert abs(part.float().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / (N // 10))


@pytest.mark.parametrize("p, bits", [(0.1, 16), (0.3, 16), (0.5, 16), (0.7, 32), (1e-6, 16)])
def test_the_drop_threshold_is_p_to_the_integers_resolution(p, bits):
    """Dropped exactly when the element's integer is below -2^(bits-1) + round(p * 2^bits): read the integers of the
    same seeded draw back and compare element by element (the rate is within 2^-(bits+1) of p)."""
    n = 4099  # not a multiple of a draw's elements: the last draw is partly used
    torch.manual_seed(5)
    dropped = dropout(torch.ones(n), p) == 0
    torch.manual_seed(5)
    draws = torch.empty(-(-n // (64 // bits)), dtype=torch.int64).random_(-(2 ** 63), None)
    ints = draws.view(torch.int16 if bits == 16 else torch.int32)[:n].long()
    assert torch.equal(dropped, ints < -(2 ** (bits - 1)) + round(p * 2 ** bits))
    assert abs(round(p * 2 ** bits) / 2 ** bits - p) <= 2 ** -(bits + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_elements_scaled_once_in_the_input_dtype(dtype):
    torch.manual_seed(1)
    x = torch.randn(257, 33).to(dtype)  # an odd number of elements: the last 64-bit draw is half used
    y = dropout(x, 0.3)
    assert y.shape == x.shape and y.dtype == dtype
    kept = y != 0
    expected = (x.float() * (1 / 0.7)).to(dtype)  # one rounding from fp32 (torch's CPU kernel rounds the scale first)
    assert torch.equal(y[kept], expected[kept])
    assert 0.2 < 1 - kept.float().mean().item() < 0.4


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 32, requires_grad=True)
    y = dropout(x, 0.25)
    g = torch.randn_like(y)
    y.backward(g)
    mask = (y != 0).float()
    torch.testing.assert_close(x.grad, g * mask / 0.75, rtol=1e-6, atol=0)


def test_seeded_draws_repeat_and_differ_between_seeds():
    x = torch.ones(10_000)
    torch.manual_seed(7)
    a = dropout(x, 0.3)
    torch.manual_seed(7)
    b = dropout(x, 0.3)
    torch.manual_seed(8)
    c = dropout(x, 0.3)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_identity_when_not_training_or_p_zero_and_zeros_at_p_one_or_a_hair_below():
    x = torch.randn(5, 7)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    for p in (1.0, 1 - 1e-10):  # round(p * 2^32) = 2^32: every element dropped, none scaled by 1e10
        assert torch.equal(dropout(x, p), torch.zeros_like(x))
    assert dropout(torch.ones(()), 0.5).shape == () and dropout(torch.ones(0, 3), 0.5).shape == (0, 3)
    module = Dropout(0.3).eval()
    assert module(x) is x and "p=0.3" in repr(module)


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_probability_outside_zero_one_is_refused(p):
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\]"):
        Dropout(p)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\]"):
        dropout(torch.ones(3), p)


def test_expectation_matches_torch_dropout():
    """Same expectation as F.dropout: the mean over many elements of dropout(x) is mean(x) (5 sigma)."""
    torch.manual_seed(3)
    x = torch.rand(N) + 0.5  # in [0.5, 1.5)
    ours, theirs = dropout(x, 0.3).mean().item(), F.dropout(x, 0.3).mean().item()
    sigma = math.sqrt((x.square().mean().item() / 0.7 - x.mean().item() ** 2) / N)
    assert abs(ours - x.mean().item()) < 5 * sigma and abs(theirs - x.mean().item()) < 5 * sigma


def test_compiled_code_traces_without_a_graph_break():
    """Under torch.compile the call is torch's dropout (``random_`` would break the graph at every sub-layer)."""
    import torch._dynamo as dynamo

    explained = dynamo.explain(lambda x: dropout(x, 0.3) * 2)(torch.ones(8))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_the_model_uses_this_dropout_everywhere():
    model = Transformer(TransformerConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                          n_decoder_layers=1, dropout=0.2))
    ours = [m for m in model.modules() if isinstance(m, Dropout)]
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())
    residual = [m for m in ours if m.p == 0.2]  # embeddings, encoder 2, decoder 3 sub-layers
    assert len(residual) == 1 + 2 + 3
    assert len(ours) == len(residual) + 2 and all(m.p == 0.0 for m in ours if m not in residual)  # activation_dropout
