"""benchmarks/benchmark_step.py (the training step's tokens/s and share of the matmul ceiling per precision, batch size,
kernel, torch.compile), run as the command it is: a one-round table of every variant comes out (of experiment=smoke's
tiny model), its batches are the recipe's, its baselines (benchmarks/baselines.py) pass their check against the
current code, and a wrong reference stops it before timing."""

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "benchmark_step.py"


def benchmark(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_one_round_prints_every_variant_against_the_fp32_fused_reference(tmp_path):
    out = tmp_path / "report.json"
    # experiment=smoke's tiny model: what is checked is the table, not the recipe's speed, and a bf16 step of the
    # recipe's shape takes seconds where bf16 is emulated (2.3 s against 73 ms, torch held to AVX2 kernels)
    run = benchmark("--tokens", "256", "--rounds", "1", "--pool", "1", "--no-compile", "--previous-loss",
                    "--previous-chunks", "--previous-dropout", "--ema", "--rdrop", "--experiment", "smoke",
                    "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    names = [row["variant"] for row in report["rows"]]
    assert names == ["32-true plain", "32-true fused", "bf16-mixed plain", "bf16-mixed fused",
                     "32-true fused previous loss", "bf16-mixed plain previous loss",
                     "32-true fused loss in large chunks", "bf16-mixed plain loss in large chunks",
                     "32-true fused torch dropout", "bf16-mixed plain torch dropout",
                     "32-true fused 32-bit dropout", "bf16-mixed plain 32-bit dropout",
                     "32-true fused ema", "bf16-mixed plain ema", "32-true fused rdrop", "bf16-mixed plain rdrop"]
    # One round on the pool's one batch: every variant steps on that batch, so its rate times its step time is the
    # batch's target tokens (not its padded cells, not its source side), and its model FLOP/s times its step time
    # the batch's FLOPs, the same for every variant (one model, one batch).
    batch = report["batches"]["256"][0]
    assert batch["tgt_tokens"] < batch["tgt"][0] * (batch["tgt"][1] - 1)  # padding: the cells are not the tokens
    flops = []
    for row in report["rows"]:
        assert row["tgt_tokens_per_sec"] * row["ms_per_step"] / 1000 == pytest.approx(batch["tgt_tokens"], rel=1e-9)
        assert row["ceiling_gflops"] > 0
        flops.append(row["model_gflops"] * row["ms_per_step"] / 1000)
    assert max(flops) == pytest.approx(min(flops), rel=1e-9) and min(flops) > 0
    assert report["reference"] == "32-true fused"
    assert "Fastest per precision" in run.stdout and "| 256 |" in run.stdout

    # the recipe's batches: at most the budget per side, widths a multiple of 8, Multi30k's ~15 subwords a sentence
    assert len(report["batches"]["256"]) == 1
    for batch in report["batches"]["256"]:
        for side in ("src", "tgt"):
            rows, width = batch[side]
            assert rows * width <= 256 and width % 8 == 0
        assert 5 <= batch["tgt_tokens"] / batch["tgt"][0] <= 40


def test_a_wrong_reference_stops_before_timing():
    run = benchmark("--tokens", "256", "--no-compile", "--reference", "bf16 plain")
    assert run.returncode != 0 and "--reference 'bf16 plain' is not an eager variant" in run.stderr, run.stderr
    assert "Training step of" not in run.stdout


def test_an_experiment_gives_its_model_vocabulary_and_train_settings():
    """--experiment NAME: the shape experiment=NAME composes (multi30k_tiny: conf/experiment/multi30k_tiny.yaml),
    else model=small with the defaults."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from recipe import small_recipe
    finally:
        sys.path.pop(0)
    tiny, tiny_train = small_recipe("multi30k_tiny")
    assert (tiny["d_model"], tiny["d_ff"], tiny["n_encoder_layers"], tiny["vocab_size"], tiny["dropout"]) == \
        (128, 256, 4, 10000, 0.3)
    assert (tiny_train["lr"], tiny_train["warmup_steps"], tiny_train["eps"]) == (0.005, 2000, 1e-8)
    small, _ = small_recipe()
    assert (small["d_model"], small["d_ff"], small["n_encoder_layers"], small["vocab_size"]) == (256, 1024, 3, 8000)


def test_the_option_variants_step_with_their_training_option_from_the_same_weights(monkeypatch):
    """--ema: the variant's step ends as module.optimizer_step does under train.ema_decay, the average moved once
    toward the stepped weights (ema <- ema + (1 - d_1) (w - ema)); the other variants keep no average. --rdrop: the
    step runs R-Drop's two passes (their divergence summed), the plain one none. Each starts from base's weights."""
    import torch

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import benchmark_step as bench
        from recipe import small_recipe
    finally:
        sys.path.pop(0)
    import transformer_nmt.training.module as module_code
    from transformer_nmt.model.dropout import Dropout
    from transformer_nmt.training.module import TranslationModule

    small, train = small_recipe("smoke")
    monkeypatch.setattr(bench, "SMALL", small)
    monkeypatch.setattr(bench, "TRAIN", train)
    base = TranslationModule({**small, "dropout": 0.3}, train)  # as main() builds it for --dropout 0.3

    def dropouts(module) -> list[float]:  # every dropout's p, in module order (attention's 0.0 among them)
        return [m.p for m in module.modules() if isinstance(m, Dropout)]

    with_ema, rdrop, without = (bench.Step(base, "32-true", "plain", False, option=o) for o in ("ema", "rdrop", None))
    assert without.module.ema is None and with_ema.name == "32-true plain ema"
    assert rdrop.module.ema is None and with_ema.module.rdrop_alpha == 0.0  # one option each
    for variant in (with_ema, rdrop):
        assert dropouts(variant.module) == dropouts(base) and 0.3 in dropouts(base)  # base's dropout kept
        weights = variant.module.state_dict()
        assert all(torch.equal(weights[k], v) for k, v in base.state_dict().items())
    batch = bench.batches(256, 1)[0]
    divergence = mock.Mock(wraps=module_code.symmetric_kl)  # R-Drop's term between the two passes
    with mock.patch.object(module_code, "symmetric_kl", divergence):
        without(batch)
        assert divergence.call_count == 0
        rdrop(batch)
        assert divergence.call_count == 1 and rdrop.module.rdrop_alpha == 5.0
    before = [a.clone() for a in with_ema.module.ema.average]
    with_ema(batch)
    ema = with_ema.module.ema
    assert ema.updates == 1
    weight = 1 - ema.decay_at(1)
    for old, new, param in zip(before, ema.average, ema.params):
        torch.testing.assert_close(new, old + weight * (param.detach() - old), rtol=0, atol=1e-7)
    assert any(not torch.equal(old, new) for old, new in zip(before, ema.average))
