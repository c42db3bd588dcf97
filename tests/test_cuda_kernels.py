"""On a CUDA device, in bf16 and fp16 autocast: every attention kernel gives the model the outputs and
gradients of ``plain``, and the chunked loss those of the unchunked one. Skipped without CUDA
(scripts/gpu_check.sh runs them: ``pytest -m cuda``)."""

import pytest
import torch

from transformer_nmt.model.attention import ATTENTION_KERNELS
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.training.loss import label_smoothed_cross_entropy

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Every kernel is measured against the float64 truth (the same model and batch, no autocast), not against
# ``plain``: two kernels that each round to 1% may differ from each other by more than either differs from the
# truth (fp16 gradients of this model: about 1.1% each, measured on CPU and on an H200). A kernel may be at most
# KERNEL_FACTOR times as far from the truth as ``plain`` is, and ``plain`` itself within PLAIN_BOUND.
KERNEL_FACTOR = 1.5
PLAIN_BOUND = {"bf16": {"logits": 2e-2, "grads": 1e-1}, "fp16": {"logits": 4e-3, "grads": 3e-2}}


def relative_error(x, ref):
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def forward_backward(kernel, dtype, src, tgt):
    """Logits and every parameter's gradient: under autocast in ``dtype``, or all in float64."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=1000, d_model=128, n_heads=4, n_encoder_layers=2,
                                          n_decoder_layers=2, d_ff=256, dropout=0.0, attention=kernel)).cuda()
    if dtype is torch.float64:
        model = model.double()
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not torch.float64):
        logits = model(src, tgt[:, :-1])
        loss = label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, 0)[0]
    loss.backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def ragged_batch():
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, 1000, (8, 150), generator=g), torch.randint(4, 1000, (8, 141), generator=g)
    for row, (s, t) in enumerate([(150, 141), (3, 2), (77, 90), (149, 10), (20, 140), (1, 1), (64, 64), (130, 5)]):
        src[row, s:], tgt[row, t + 1:] = 0, 0  # right-padded; lengths past a 128-key block, a single token
    return src.cuda(), tgt.cuda()


def errors_from_truth(kernel, dtype, src, tgt, truth):
    """Relative errors of the logits (real positions) and of all gradients as one vector against float64's
    (one vector: some gradients are zero in exact arithmetic, key biases, since softmax ignores a shift)."""
    logits, grads = forward_backward(kernel, dtype, src, tgt)
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), (kernel, name)
    real = (tgt[:, :-1] != 0)  # pad rows carry no loss and may differ between kernels
    flat, flat_ref = (torch.cat([g.flatten() for g in gs.values()]) for gs in (grads, truth[1]))
    return {"logits": relative_error(logits[real], truth[0][real]), "grads": relative_error(flat, flat_ref)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", [k for k in ATTENTION_KERNELS if k != "plain"])
def test_every_kernel_is_as_close_to_float64_as_plain_in_low_precision(kernel, dtype):
    src, tgt = ragged_batch()
    truth = forward_backward("plain", torch.float64, src, tgt)
    plain = errors_from_truth("plain", DTYPES[dtype], src, tgt, truth)
    other = errors_from_truth(kernel, DTYPES[dtype], src, tgt, truth)
    print(f"[{kernel} {dtype}] relative error from float64: plain {plain}, {kernel} {other}")
    for what in ("logits", "grads"):
        assert plain[what] < PLAIN_BOUND[dtype][what], (what, plain)
        assert other[what] < KERNEL_FACTOR * plain[what], (what, other, plain)


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_loss_on_cuda_matches_a_float64_reference(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(4000, 3000, device="cuda", generator=g).to(DTYPES[dtype]).requires_grad_()
    labels = torch.randint(0, 3000, (4000,), device="cuda", generator=g)  # label 0 = pad: ~1/3000 ignored
    loss = label_smoothed_cross_entropy(logits, labels, 0.1, 0)[0]
    loss.backward()
    reference = logits.detach().double().requires_grad_()
    expected = torch.nn.functional.cross_entropy(reference, labels, ignore_index=0, label_smoothing=0.1,
                                                 reduction="sum")
    expected.backward()
    assert relative_error(loss, expected) < 1e-6
    assert relative_error(logits.grad, reference.grad) < 1e-2  # the gradient is rounded to the logits' dtype
