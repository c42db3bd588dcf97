"""Where a training run's time goes (time_budget.TimeBudget) and its model FLOPs (flops.py): the FLOPs formula
against a hand count, the exclusive phase accounting on a fake clock, and a tiny run whose phases add up to its
measured wall time, read back by scripts/reproduce_multi30k.py."""

import json
from pathlib import Path

import pytest
import torch

import transformer_nmt.analysis.reproduce as reproduce
import transformer_nmt.training.time_budget as time_budget
from test_train_app import one_thread, tiny_config, write_tiny_corpus  # noqa: F401 (fixture)
from transformer_nmt.model.flops import FlopCount, matmul_ceiling, model_flops
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.training.time_budget import PHASES, TimeBudget
from transformer_nmt.training.app import train
from transformer_nmt.training.callbacks import AttentionMaps


def test_model_flops_equal_a_hand_count_on_a_tiny_model():
    model = Transformer(TransformerConfig(vocab_size=10, d_model=4, n_heads=2, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=8))
    # encoder layer: in_proj 4x12+12, out_proj 4x4+4, FFN 4x8+8 and 8x4+4, 2 LayerNorms of 4+4 -> 172
    # decoder layer: 2 attentions (160), FFN (76), 3 LayerNorms (24) -> 260; output layer 10 x 4 (tied) -> 300
    src = torch.tensor([[5, 6, 2], [7, 2, 0]])  # 3 and 2 real tokens
    tgt = torch.tensor([[1, 8, 2], [1, 2, 0]])  # bos + 2 and bos + 1: 2 and 1 tokens with a loss
    matmuls = 6 * (172 * 5 + 300 * 3)
    pairs = (3 * 3 + 2 * 2) + (2 * 2 + 1 * 1) + (2 * 3 + 1 * 2)  # encoder self, decoder self (full), cross
    attention = 6 * 2 * (2 + 2) * pairs  # h (d_k + d_v) = 2 x (2 + 2)
    assert model_flops(model, {"src": src, "tgt": tgt}) == matmuls + attention == 11808
    assert FlopCount.of(model)(src, tgt).dtype == torch.float64  # a device tensor: summed without a host read
    # one definition for the GPU check and the training run: scripts/gpu_check.py imports this one
    gpu_check = (Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py").read_text()
    assert "from transformer_nmt.model.flops import model_flops" in gpu_check and "def model_flops" not in gpu_check


def test_matmul_ceiling_measures_both_of_the_models_shapes():
    ceiling = matmul_ceiling(d_model=16, d_ff=32, vocab_size=64, tokens=24, seconds=0.02)
    assert ceiling["shapes"] == {"ffn": [24, 16, 32], "output": [24, 16, 64]}
    assert ceiling["ceiling_gflops"] == max(ceiling["gflops"].values()) > 0
    assert ceiling["dtype"] == "float32" and ceiling["threads"] == torch.get_num_threads()


def test_each_second_counts_in_one_phase_the_innermost(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time_budget.time, "perf_counter", lambda: now[0])
    budget = TimeBudget()
    budget.enter("fit_other")
    now[0] = 1.0
    budget.enter("validation")
    now[0] = 3.0
    with budget.phase("checkpointing"):  # inside validation: its 4 s are not validation's
        now[0] = 7.0
    now[0] = 8.0
    budget.exit("validation")
    budget.enter("training_steps")
    budget.enter("attention_maps")
    now[0] = 10.0
    budget.exit("training_steps")  # an exception skipped attention_maps' exit: it closes with its parent
    now[0] = 10.5
    budget.exit("fit_other")
    budget.exit("test")  # never entered: nothing happens
    assert budget.seconds == {**dict.fromkeys(PHASES, 0.0), "fit_other": 1.5, "validation": 3.0,
                              "checkpointing": 4.0, "attention_maps": 2.0}
    assert sum(budget.seconds.values()) == 10.5


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny run with everything the recipe times: 12 steps (the epoch's 10 batches, its validation, 2 more),
    checkpoints, attention maps after each validation, the test after fit."""
    tmp = tmp_path_factory.mktemp("budget")
    corpus = write_tiny_corpus(tmp / "corpus")
    torch.set_num_threads(1)
    trainer = train(tiny_config(corpus, "trainer.max_steps=12", "run_test=true", "checkpoint.every_n_train_steps=4",
                                "attention_maps.every_n_validations=1"), tmp / "run")
    return trainer, json.loads((tmp / "run" / "results.json").read_text()), tmp / "run"


def test_a_runs_phases_add_up_to_its_wall_time(tiny_run):
    trainer, results, _ = tiny_run
    budget = results["time_budget"]
    seconds = budget["seconds"]
    assert set(seconds) == set(PHASES)
    for phase in ("training_steps", "validation", "checkpointing", "attention_maps", "fit_other", "test"):
        assert seconds[phase] > 0, phase
    # The phases inside fit hold the fit's wall time, to rounding (each phase is rounded to 0.01 s).
    inside_fit = sum(seconds[p] for p in PHASES if p != "test")
    assert inside_fit == pytest.approx(budget["fit_seconds"], abs=0.05)
    # With what no phase holds (start-up, data preparation), they are the run's wall time.
    assert sum(seconds.values()) <= budget["wall_seconds"] + 0.05
    assert sum(seconds.values()) + budget["outside_phases"] == pytest.approx(budget["wall_seconds"], abs=0.05)
    assert sum(budget["share"].values()) == pytest.approx(1.0, abs=0.01)
    assert budget["wall_seconds"] == pytest.approx(results["wall_seconds"], abs=0.1)


def test_a_runs_mfu_is_its_model_flops_over_its_step_time_against_a_measured_ceiling(tiny_run):
    trainer, results, _ = tiny_run
    budget = results["time_budget"]
    mfu = budget["mfu"]
    assert mfu["training_batches"] == results["steps"] == 12
    assert mfu["achieved_gflops"] == pytest.approx(mfu["model_gflop"] / budget["seconds"]["training_steps"], rel=0.05)
    ceiling = mfu["ceiling"]
    assert ceiling["dtype"] == "float32" and ceiling["threads"] == results["torch_threads"]  # the run's 32-true
    assert ceiling["tokens"] == mfu["mean_target_rows"] > 0
    assert mfu["share_of_ceiling"] == pytest.approx(mfu["achieved_gflops"] / ceiling["ceiling_gflops"], rel=0.01)


def test_reproduce_reads_the_time_budget_from_results_json(tiny_run):
    _, results, run_dir = tiny_run
    train_seconds = results["wall_seconds"] + 5.0  # the train step's process: start-up on top of train()
    report = reproduce.where_the_time_went(results, train_seconds)
    phases = report["phases"]
    assert list(phases) == list(reproduce.PHASE_LABELS)
    assert report["wall_seconds"] == pytest.approx(train_seconds, abs=0.1)
    assert sum(p["seconds"] for p in phases.values()) == pytest.approx(train_seconds, abs=0.5)
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0, abs=0.01)
    assert phases["outside_phases"]["seconds"] >= 5.0
    assert report["mfu"]["share_of_ceiling"] > 0
    assert reproduce.where_the_time_went({"wall_seconds": 3.0}, None) is None  # a run older than the budget
    reproduce.print_time_budget(report, results["precision"])


def test_reproduce_json_holds_the_time_budget_of_a_scored_run(tiny_run, monkeypatch):
    """main(train=false) on the tiny run, its subprocesses (average, evaluate) stubbed: reproduce.json carries the
    run's time budget (of the train() call, since this launch did not train) and its precision."""
    _, results, run_dir = tiny_run
    scores = dict(bleu=1.0, bleu_lowercase=1.0, chrf=2.0, length_ratio=1.0, bp=1.0)
    monkeypatch.setattr(reproduce, "run_step", lambda name, args, timings, root: timings.setdefault(name, 0.0))
    monkeypatch.setattr(reproduce, "evaluate", lambda ckpt, split, beam, out, timings, root: dict(scores))
    report = reproduce.main(["train=false", f"run_dir={run_dir}"])
    written = json.loads((run_dir / "reproduce.json").read_text())
    assert written["time_budget"] == report["time_budget"] and written["precision"] == results["precision"]
    budget = written["time_budget"]
    assert budget["of"] == "train() call" and budget["wall_seconds"] == pytest.approx(results["wall_seconds"], abs=0.1)
    assert set(budget["phases"]) == set(reproduce.PHASE_LABELS) and budget["mfu"]["ceiling"]["ceiling_gflops"] > 0


def test_the_run_hands_its_budget_to_the_checkpoint_writer_and_the_maps(tiny_run):
    """Explicit links: the app builds the checkpoint IO with the budget, AttentionMaps finds it in trainer.callbacks."""
    trainer = tiny_run[0]
    budget = TimeBudget.of(trainer.callbacks)
    assert isinstance(budget, TimeBudget)
    assert trainer.strategy.checkpoint_io.time_budget is budget
    assert next(c for c in trainer.callbacks if isinstance(c, AttentionMaps)).time_budget is budget
    assert budget.seconds["checkpointing"] > 0 and budget.seconds["attention_maps"] > 0
