"""On a CUDA device, in bf16 and fp16 autocast: every attention kernel gives the model the outputs and
gradients of ``plain``, and the chunked loss those of the unchunked one. Skipped without CUDA
(scripts/gpu_check.sh runs them: ``pytest -m cuda``)."""

import pytest
import torch

from transformer_nmt.model.attention import ATTENTION_KERNELS
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.training.module import label_smoothed_cross_entropy

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Relative error ||x - plain|| / ||plain|| allowed between two kernels in one autocast dtype.
TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}


def relative_error(x, ref):
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def forward_backward(kernel, dtype, src, tgt):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=1000, d_model=128, n_heads=4, n_encoder_layers=2,
                                          n_decoder_layers=2, d_ff=256, dropout=0.0, attention=kernel)).cuda()
    with torch.autocast("cuda", dtype=dtype):
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", [k for k in ATTENTION_KERNELS if k != "plain"])
def test_every_kernel_matches_plain_in_low_precision(kernel, dtype):
    src, tgt = ragged_batch()
    logits_ref, grads_ref = forward_backward("plain", DTYPES[dtype], src, tgt)
    logits, grads = forward_backward(kernel, DTYPES[dtype], src, tgt)
    real = (tgt[:, :-1] != 0)  # pad rows carry no loss and may differ between kernels
    assert relative_error(logits[real], logits_ref[real]) < TOLERANCE[dtype]
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name
    # All gradients as one vector: some are zero in exact arithmetic (key biases: softmax ignores a shift).
    flat, flat_ref = (torch.cat([g.flatten() for g in gs.values()]) for gs in (grads, grads_ref))
    assert relative_error(flat, flat_ref) < 2 * TOLERANCE[dtype]


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
