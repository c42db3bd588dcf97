"""Where a training run's time goes (time_budget.TimeBudget) and its model FLOPs (flops.py): the FLOPs formula
against a hand count, the exclusive phase accounting on a fake clock, and a tiny run whose phases add up to its
measured wall time, read back by transformer_nmt.reproduce."""

import json
import time
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from tiny_corpus import tiny_config, write_tiny_corpus

import transformer_nmt.analysis.reproduce as reproduce
import transformer_nmt.training.time_budget as time_budget
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.model.flops import FlopCount, matmul_ceiling, model_flops
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.training.app import train
from transformer_nmt.training.callbacks import AttentionMaps
from transformer_nmt.training.module import TranslationModule
from transformer_nmt.training.time_budget import PHASES, TimeBudget


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
    # a run of 14 s: 3.5 s in no phase; shares of the 14 s, by hand (3 / 14 = 0.2143, ...)
    assert budget.report(14.0) == {
        "seconds": {**dict.fromkeys(PHASES, 0.0), "fit_other": 1.5, "validation": 3.0, "checkpointing": 4.0,
                    "attention_maps": 2.0},
        "fit_seconds": 0.0, "rank": "global rank 0", "wall_seconds": 14.0, "outside_phases": 3.5,
        "share": {**dict.fromkeys(PHASES, 0.0), "fit_other": 0.1071, "validation": 0.2143, "checkpointing": 0.2857,
                  "attention_maps": 0.1429, "outside_phases": 0.25},
        "mfu": None}  # no training step: nothing to rate


def test_mfu_is_the_training_steps_flops_over_their_seconds_on_a_fake_clock(monkeypatch):
    """Two training batches of the hand-counted tiny model (11,808 FLOPs each, test above) of 1 us each on a fake
    clock, in a fit of 10 us: 23,616 FLOPs / 2 us = 11.81 GFLOP/s (over the fit: 2.36); against a ceiling of
    47.232 GFLOP/s, a share of 0.25. The target side's rows: 2 x 2 per batch."""
    now = [0.0]
    monkeypatch.setattr(time_budget.time, "perf_counter", lambda: now[0])
    model = Transformer(TransformerConfig(vocab_size=10, d_model=4, n_heads=2, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=8))
    batch = {"src": torch.tensor([[5, 6, 2], [7, 2, 0]]), "tgt": torch.tensor([[1, 8, 2], [1, 2, 0]])}
    budget = TimeBudget()
    budget.setup(None, SimpleNamespace(model=model), "fit")
    budget.on_fit_start(None, None)
    for start in (2e-6, 5e-6):
        now[0] = start
        budget.on_train_batch_start(None, None, batch, 0)
        now[0] = start + 1e-6
        budget.on_train_batch_end(None, None, None, batch, 0)
    now[0] = 1e-5
    budget.on_fit_end(None, None)
    budget.ceiling = {"ceiling_gflops": 47.232}  # what on_train_end measures
    assert budget.mfu() == {"model_gflop": 0.0, "training_batches": 2, "mean_target_rows": 4,
                            "achieved_gflops": 11.81, "achieved_gflops_over_fit": 2.36,
                            "ceiling": {"ceiling_gflops": 47.232}, "share_of_ceiling": 0.25}
    assert budget.seconds["training_steps"] == pytest.approx(2e-6) and budget.fit_seconds == pytest.approx(1e-5)


def test_the_budget_waits_for_background_work_before_its_probe_and_counts_the_wait(monkeypatch):
    """At the end of training the TimeBudget waits for every BackgroundWork callback (AttentionMaps' render
    thread) before it measures the matmul ceiling on the same cores, and the wait counts in that callback's phase
    (fake clock: the render ends 2 s after the wait starts)."""
    now, events = [0.0], []
    monkeypatch.setattr(time_budget.time, "perf_counter", lambda: now[0])
    maps = AttentionMaps(probes=["Two dogs play."])

    def render_ends():
        now[0] += 2.0
        events.append("render waited for")

    def ceiling(*args, **kwargs):
        events.append("probe")
        return {"ceiling_gflops": 1.0}

    monkeypatch.setattr(maps, "wait", render_ends)
    monkeypatch.setattr(time_budget, "matmul_ceiling", ceiling)
    budget = TimeBudget()
    budget.batches, budget.rows = 1, 4  # one training batch: the probe runs
    trainer = SimpleNamespace(is_global_zero=True, callbacks=[budget, maps], precision="32-true")
    model = SimpleNamespace(config=SimpleNamespace(d_model=4, d_ff=8, vocab_size=10))
    budget.on_train_end(trainer, SimpleNamespace(model=model, device="cpu"))
    assert events == ["render waited for", "probe"]
    assert budget.seconds["attention_maps"] == 2.0 and budget.ceiling == {"ceiling_gflops": 1.0}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny run with everything the recipe times: 12 steps (the epoch's 10 batches, its validation, 2 more),
    checkpoints, attention maps after each validation, the test after fit. Beside it, the test's own record:
    the perf_counter spans of the train() call and of the Trainer's fit and test calls in it, and every
    training batch as the module received it."""
    tmp = tmp_path_factory.mktemp("budget")
    corpus = write_tiny_corpus(tmp / "corpus")
    torch.set_num_threads(1)
    spans, batches = {}, []

    def spanned(name, method):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spans[name] = (start, time.perf_counter())
        return call

    def recorded(self, batch, batch_idx):
        batches.append({key: batch[key].clone() for key in ("src", "tgt")})
        return on_train_batch_start(self, batch, batch_idx)

    on_train_batch_start = TranslationModule.on_train_batch_start
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pl.Trainer, "fit", spanned("fit", pl.Trainer.fit))
        patch.setattr(pl.Trainer, "test", spanned("test", pl.Trainer.test))
        patch.setattr(TranslationModule, "on_train_batch_start", recorded)
        trainer = spanned("train", train)(tiny_config(corpus, "trainer.max_steps=12", "run_test=true",
                                                      "checkpoint.every_n_train_steps=4",
                                                      "checkpoint.recent.keep=2",  # reproduce averages them
                                                      "attention_maps.every_n_validations=1"), tmp / "run")
    results = json.loads((tmp / "run" / "results.json").read_text())
    return trainer, results, tmp / "run", SimpleNamespace(spans=spans, batches=batches)


def test_the_train_calls_wall_time_is_rounded_once():
    """A run of 1.95 s: results.json says 2.0 (0.1 s), its budget 1.95 (0.01 s); the reproduce report keeps 1.95, where
    rounding the budget's figure again to 0.1 s gave 1.9 (1.95 is 1.9499... in binary), 0.1 from results.json."""
    results = {"wall_seconds": 2.0, "time_budget": {"wall_seconds": 1.95, "seconds": {"training_steps": 1.0}}}
    budget = reproduce.where_the_time_went(results, None)
    assert budget["of"] == "train() call" and budget["wall_seconds"] == 1.95
    assert budget["phases"]["training_steps"]["share"] == round(1.0 / 1.95, 4)


def test_a_runs_phases_add_up_to_its_wall_time(tiny_run):
    """Against the test's own clock (tiny_run's spans): the run's wall time is its train() call's; every phase lies
    in the Trainer's fit and test calls, so what train() spends outside them (data preparation, building the model
    and the trainer) is in no phase but outside_phases. Rounding: 0.01 s per phase, 0.05 s in a sum."""
    trainer, results, _, record = tiny_run
    budget, spans = results["time_budget"], record.spans
    seconds = budget["seconds"]
    assert set(seconds) == set(PHASES)
    for phase in ("training_steps", "validation", "checkpointing", "attention_maps", "fit_other", "test"):
        assert seconds[phase] > 0, phase
    # The phases inside fit hold the fit's wall time (on_fit_start to on_fit_end), to rounding.
    inside_fit = sum(seconds[p] for p in PHASES if p != "test")
    assert inside_fit == pytest.approx(budget["fit_seconds"], abs=0.05)
    (train_start, train_end), (fit_start, fit_end), (test_start, test_end) = (spans[k]
                                                                              for k in ("train", "fit", "test"))
    assert test_end - train_start - 0.05 <= results["wall_seconds"] <= train_end - train_start + 0.05
    # results.json rounds to 0.1 s and the budget to 0.01 s: one time, two roundings, at most 0.055 apart.
    assert budget["wall_seconds"] == pytest.approx(results["wall_seconds"], abs=0.055)
    assert budget["fit_seconds"] <= fit_end - fit_start + 0.005 and seconds["test"] <= test_end - test_start + 0.005
    outside_calls = (fit_start - train_start) + (test_start - fit_end)  # a vocabulary trained, the data encoded, ...
    assert budget["outside_phases"] >= outside_calls - 0.06


def test_a_runs_mfu_is_its_model_flops_over_its_step_time_against_a_measured_ceiling(tiny_run):
    """The FLOPs and rows the budget summed on the device are those of the batches the module received (the test's
    record; flops.model_flops per batch, the hand-counted formula); the division is the fake-clock test's."""
    trainer, results, _, record = tiny_run
    mfu = results["time_budget"]["mfu"]
    model = trainer.lightning_module.model
    assert mfu["training_batches"] == results["steps"] == len(record.batches) == 12
    flops = sum(model_flops(model, batch) for batch in record.batches)
    assert abs(mfu["model_gflop"] - flops / 1e9) <= 0.05 + 1e-9  # rounded to 0.1 GFLOP
    rows = round(sum(batch["tgt"][:, 1:].numel() for batch in record.batches) / 12)
    ceiling = mfu["ceiling"]
    assert mfu["mean_target_rows"] == rows == ceiling["tokens"]  # the ceiling measured at the batches' rows
    assert ceiling["dtype"] == "float32" and ceiling["threads"] == results["torch_threads"]  # the run's 32-true
    assert ceiling["shapes"] == {"ffn": [rows, model.config.d_model, model.config.d_ff],
                                 "output": [rows, model.config.d_model, model.config.vocab_size]}


SECONDS = {"training_steps": 10.0, "validation": 4.0, "checkpointing": 1.0, "attention_maps": 0.5, "mfu_probe": 0.5,
           "fit_other": 2.0, "test": 1.0}  # 19 s in phases


def test_reproduce_reads_the_time_budget_from_results_json(capsys):
    """A budget of 19 s in phases, from a train() call of 20 s, in a train step of 25 s: 6 s outside the phases
    (start-up, imports, data preparation), each share of the 25 s, by hand; without the step's time, of the 20 s."""
    results = {"wall_seconds": 20.0, "time_budget": {"seconds": SECONDS, "wall_seconds": 20.0, "mfu": None,
                                                     "rank": "global rank 0"}}
    report = reproduce.where_the_time_went(results, 25.0)
    shares = {"training_steps": 0.4, "validation": 0.16, "checkpointing": 0.04, "attention_maps": 0.02,
              "mfu_probe": 0.02, "fit_other": 0.08, "test": 0.04, "outside_phases": 0.24}
    assert report == {"wall_seconds": 25.0, "of": "train step", "mfu": None, "view": "global rank 0",
                      "phases": {p: {"seconds": {**SECONDS, "outside_phases": 6.0}[p], "share": shares[p]}
                                 for p in reproduce.PHASE_LABELS}}
    assert list(report["phases"]) == list(reproduce.PHASE_LABELS)
    of_the_call = reproduce.where_the_time_went(results, None)
    assert of_the_call["of"] == "train() call" and of_the_call["phases"]["outside_phases"] == {"seconds": 1.0,
                                                                                               "share": 0.05}
    assert reproduce.where_the_time_went({"wall_seconds": 3.0}, None) is None  # a run older than the budget
    reproduce.print_time_budget(report, "32-true")
    printed = capsys.readouterr().out
    assert "| where the train step's 0.4 minutes went | seconds | share |" in printed
    assert f"| {reproduce.PHASE_LABELS['training_steps']} | 10.0 | 40.0% |" in printed
    assert f"| {reproduce.PHASE_LABELS['outside_phases']} | 6.0 | 24.0% |" in printed


@pytest.mark.parametrize("val, chosen", [({"averaged": 31.0, "last": 30.0}, "averaged"),
                                         ({"averaged": 30.0, "last": 31.0}, "last"),
                                         ({"averaged": 30.0, "last": 30.0}, "averaged")],  # a tie: the average
                         ids=["average-higher", "last-higher", "tie"])
def test_reproduce_chooses_on_val_scores_on_test_and_holds_the_time_budget(tiny_run, monkeypatch, val, chosen):
    """main(train=false) on the tiny run, its subprocesses (average, evaluate) stubbed: the checkpoint with the
    higher val BLEU (beam 4) is chosen, whichever it is, and only it is scored on test, after the choice; the
    other's test score, the higher one here, could not have decided. reproduce.json carries the run's time budget
    (of the train() call, since this launch did not train) and its precision."""
    _, results, run_dir, _ = tiny_run
    beam = DecodeConfig().beam
    calls = []

    def evaluate(ckpt, split, search, out, timings, root, trust_data_paths=False, extra=()):
        width = search["beam"]  # the run's search (its config's decode node; DecodeConfig's for an older run)
        calls.append((ckpt.name, split, width))
        assert list(extra) == ["metrics=[bleu,bleu_lowercase,chrf,bleu_multi30k]"]  # evaluate's own, select_on's bleu
        bleu = val[ckpt.stem] if (split, width) == ("val", beam) else 100.0 - val[ckpt.stem] - width
        return dict(bleu=bleu, bleu_lowercase=bleu, bleu_multi30k=bleu, chrf=2.0, length_ratio=1.0, bp=1.0)

    monkeypatch.setattr(reproduce, "run_step", lambda name, args, timings, root: timings.setdefault(name, 0.0))
    monkeypatch.setattr(reproduce, "evaluate", evaluate)
    report = reproduce.main(["train=false", f"run_dir={run_dir}"])
    name = f"{chosen}.ckpt"
    assert calls == [("averaged.ckpt", "val", beam), ("last.ckpt", "val", beam), (name, "test", beam),
                     (name, "val", 1), (name, "test", 1)]
    written = json.loads((run_dir / "reproduce.json").read_text())
    assert written["chosen"] == name and written["val_bleu_chosen_on"] == val
    assert written["scores"]["val_beam4"]["bleu"] == val[chosen]
    assert written["scores"]["test_beam4"]["bleu"] == 100.0 - val[chosen] - beam
    assert written["time_budget"] == report["time_budget"] and written["precision"] == results["precision"]
    budget = written["time_budget"]
    # The budget keeps the run's own 0.01 s (no second rounding), results.json rounds to 0.1 s.
    assert budget["of"] == "train() call"
    assert budget["wall_seconds"] == pytest.approx(results["wall_seconds"], abs=0.055)
    assert set(budget["phases"]) == set(reproduce.PHASE_LABELS) and budget["mfu"]["ceiling"]["ceiling_gflops"] > 0


def test_the_run_hands_its_budget_to_the_checkpoint_writer_and_the_maps(tiny_run):
    """Explicit links: the app builds the checkpoint IO with the budget, AttentionMaps finds it in trainer.callbacks."""
    trainer = tiny_run[0]
    budget = TimeBudget.of(trainer.callbacks)
    assert isinstance(budget, TimeBudget)
    assert trainer.strategy.checkpoint_io.time_budget is budget
    assert next(c for c in trainer.callbacks if isinstance(c, AttentionMaps)).time_budget is budget
    assert budget.seconds["checkpointing"] > 0 and budget.seconds["attention_maps"] > 0


def test_reproduce_reports_a_table_per_pair_for_a_model_of_several(tiny_run, monkeypatch, capsys):
    """Where evaluate's records hold each pair (a model of data.pairs: evaluate_pairs), reproduce.json holds
    scores_by_pair, each pair's scores per split and search, beside the means under scores, and prints a table per
    pair; a one-pair run's report has none (the test above)."""
    _, _, run_dir, _ = tiny_run
    pairs = {"en-de": 30.0, "en-fr": 40.0}

    def evaluate(ckpt, split, search, out, timings, root, trust_data_paths=False, extra=()):
        offset = (ckpt.stem == "averaged") + (split == "test") * 2 + search["beam"] / 10
        rows = {pair: dict(bleu=bleu + offset, bleu_lowercase=bleu, bleu_multi30k=None, chrf=50.0, length_ratio=1.0,
                           bp=1.0, sentences=4) for pair, bleu in pairs.items()}
        means = {k: sum(r[k] for r in rows.values()) / 2 for k in ("bleu", "bleu_lowercase", "chrf", "length_ratio",
                                                                    "bp")}
        return {**means, "bleu_multi30k": None, "pairs": rows}

    monkeypatch.setattr(reproduce, "run_step", lambda name, args, timings, root: timings.setdefault(name, 0.0))
    monkeypatch.setattr(reproduce, "evaluate", evaluate)
    reproduce.main(["train=false", f"run_dir={run_dir}"])
    written = json.loads((run_dir / "reproduce.json").read_text())
    beam = DecodeConfig().beam
    by_pair = written["scores_by_pair"]
    assert list(by_pair) == list(pairs) and set(by_pair["en-fr"]) == set(written["scores"])
    assert by_pair["en-fr"][f"test_beam{beam}"]["bleu"] == 40.0 + 1 + 2 + beam / 10  # averaged chosen, on test
    assert by_pair["en-de"]["val_beam1"]["bleu"] == 30.0 + 1 + 0.1
    assert written["scores"][f"test_beam{beam}"]["bleu"] == 35.0 + 1 + 2 + beam / 10
    printed = capsys.readouterr().out
    assert "| split (en-fr) | decoder |" in printed and "| split (mean over the pairs) | decoder |" in printed
    assert f"| test | beam {beam} | {40.0 + 3 + beam / 10:.2f} |" in printed
