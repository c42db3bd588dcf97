"""scripts/benchmark_step.py (the training step's tokens/s and share of the matmul ceiling per precision, batch size,
kernel, torch.compile): its batches are the recipe's, its loss variants agree, and a one-round table comes out."""

import pytest
import torch

from script_module import load_script
from transformer_nmt.training.module import label_smoothed_cross_entropy


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmark_step")


def test_batches_hold_multi30k_lengths_within_the_token_budget(bench):
    for batch in bench.batches(1024, 3, seed=1):
        for side in ("src", "tgt"):
            assert batch[side].numel() <= 1024 and batch[side].shape[1] % 8 == 0
        assert 5 <= (batch["tgt"][:, 1:] != 0).sum(1).float().mean() <= 40  # Multi30k: ~15 subwords a sentence


def test_the_previous_loss_it_compares_with_equals_the_current_one(bench):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 50, generator=g)
    labels = torch.randint(1, 50, (2, 7), generator=g)
    labels[1, 4:] = 0
    grads = []
    for loss_fn in (label_smoothed_cross_entropy, bench.previous_loss):
        x = logits.clone().requires_grad_()
        loss, nll, n = loss_fn(x, labels, 0.1, 0)
        loss.backward()
        grads.append((loss, nll, n, x.grad))
    for new, old in zip(*grads):
        torch.testing.assert_close(new, old, rtol=1e-6, atol=1e-7)


def test_one_round_prints_every_variant_against_the_fp32_fused_reference(bench, capsys):
    threads = torch.get_num_threads()
    try:
        report = bench.main(["--tokens", "256", "--rounds", "1", "--pool", "1", "--no-compile", "--previous-loss",
                             "--previous-chunks", "--previous-dropout"])
    finally:
        torch.set_num_threads(threads)
    names = [row["variant"] for row in report["rows"]]
    assert names == ["32-true plain", "32-true fused", "bf16-mixed plain", "bf16-mixed fused",
                     "32-true fused previous loss", "bf16-mixed plain previous loss",
                     "32-true fused loss in large chunks", "bf16-mixed plain loss in large chunks",
                     "32-true fused torch dropout", "bf16-mixed plain torch dropout"]
    for row in report["rows"]:
        assert row["tgt_tokens_per_sec"] > 0 and row["ceiling_gflops"] > 0
        assert row["share"] == pytest.approx(row["model_gflops"] / row["ceiling_gflops"])
    assert report["rows"][1]["vs_reference"] == 1.0
    assert "Fastest per precision" in capsys.readouterr().out


def test_previous_dropout_swaps_every_dropout_back_and_a_wrong_reference_stops_before_timing(bench):
    from transformer_nmt.model.dropout import Dropout
    from transformer_nmt.model.transformer import Transformer, TransformerConfig

    base = Transformer(TransformerConfig(**bench.SMALL))
    step = bench.Step(base, "32-true", "plain", False, dropout="torch")
    swapped = [m for m in step.model.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(swapped) == 1 + 3 * 2 + 3 * 3 and not any(isinstance(m, Dropout) for m in step.model.modules())
    assert all(m.p == bench.SMALL["dropout"] for m in swapped) and step.name == "32-true plain torch dropout"
    with pytest.raises(SystemExit, match="--reference 'bf16 plain' is not an eager variant"):
        bench.main(["--tokens", "256", "--no-compile", "--reference", "bf16 plain"])
