"""transformer_nmt.analysis.table3 (transformer_nmt.table3) without training: the plan covers every row of Table 3
with the seeds the study needs, a finished run's small files are kept under docs/table3 once, with the machine
it ran on, only when its overrides and settings are the plan's, and the done marker is written whole."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tiny_corpus import compose_train

import transformer_nmt.analysis.ablation as summarize_ablation
import transformer_nmt.analysis.table3 as table3
from transformer_nmt.training.app import with_run_dir


def test_the_plan_has_every_row_five_base_seeds_and_two_for_every_other_cell():
    rows = {row for _, row, _ in table3.PLAN}
    assert rows == {"base", "A", "B", "C", "D", "E", "F", "G", "H"}
    planned = table3.runs()
    assert sorted(seed for cell, _, seed in planned if cell == "base") == [1, 2, 3, 4, 5]
    others = {cell for cell, _, _ in table3.PLAN} - {"base"}
    assert all(sorted(s for c, _, s in planned if c == cell) == [1, 2] for cell in others)
    # the paper's rows: one change a cell; SwiGLU changes its width with it (equal parameters), H all at once
    assert all(len(overrides) == 1 for cell, row, overrides in table3.PLAN if row in "ABCDE" and cell != "base")
    assert len(planned) == 5 + 2 * len(others)


def test_the_swiglu_cell_has_the_base_models_parameters():
    """d_ff 344 = gated_width(512): the gated feed-forward's three matrices weigh what the base's two do (0.5%)."""
    from transformer_nmt.model.transformer import Transformer, TransformerConfig

    model = dict(vocab_size=8000, d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2)
    with torch.device("meta"):
        plain = Transformer(TransformerConfig(**model, d_ff=512)).num_parameters()
        gated = Transformer(TransformerConfig(**model, d_ff=344, activation="swiglu")).num_parameters()
    assert abs(gated - plain) / plain < 0.005
    assert ["model.activation=swiglu", "model.d_ff=344"] == next(o for c, _, o in table3.PLAN if c == "swiglu")


DOCS = Path(__file__).resolve().parent.parent / "docs" / "table3"


def finished_run(study, cell, seed, *config_changes, overrides=None):
    """outputs/CELL/seedK as the plan's command leaves it: the results.json and hypotheses that run wrote (kept
    in docs/table3, the machine taken out) and the config.yaml the app writes for the plan's command (with
    ``config_changes`` composed on top); ``overrides``: what results.json records instead of the plan's."""
    run = study.outputs / cell / f"seed{seed}"
    run.mkdir(parents=True)
    results = json.loads((DOCS / cell / f"seed{seed}" / "results.json").read_text())
    results.pop("machine")
    if overrides is not None:
        results["overrides"] = overrides
    (run / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    shutil.copyfile(DOCS / cell / f"seed{seed}" / "val_hypotheses.txt", run / "val_hypotheses.txt")
    shutil.copyfile(DOCS / "val_references.txt", run / "val_references.txt")
    plan = next(o for c, _, o in table3.PLAN if c == cell)
    cfg = with_run_dir(compose_train(*table3.planned_overrides(plan, seed), *config_changes), run)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return run, results


def test_a_finished_run_is_collected_once_with_its_machine_atomically(tmp_path, capsys, monkeypatch):
    study = table3.Study(tmp_path, tmp_path / "docs", tmp_path / "outputs")
    run, results = finished_run(study, "heads8", 2)
    (tmp_path / "docs").mkdir()
    renamed = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append((Path(a).name, Path(b))), replace(a, b))[1])

    missing = table3.status(study, ["heads8"])
    assert [(cell, seed) for cell, _, seed in missing] == [("heads8", 1)]  # seed 2 finished: collected, not rerun
    kept = tmp_path / "docs" / "heads8" / "seed2"
    assert (kept / "val_hypotheses.txt").read_bytes() == (run / "val_hypotheses.txt").read_bytes()
    assert (tmp_path / "docs" / "val_references.txt").read_bytes() == (DOCS / "val_references.txt").read_bytes()
    collected = json.loads((kept / "results.json").read_text())
    assert {k: v for k, v in collected.items() if k != "machine"} == results and collected["machine"]["cpus"] >= 1
    assert renamed[-1][1] == kept / "results.json" and renamed[-1][0].startswith("results.json.tmp-")  # last, whole
    minutes = results["wall_seconds"] / 60
    assert (f"1 of 2 runs done ({minutes / 60:.1f} h of wall time so far), about {minutes / 60:.1f} h left at "
            f"{minutes:.1f} min a run (median)") in capsys.readouterr().out


def test_a_run_with_other_overrides_or_settings_than_the_plan_is_not_collected(tmp_path):
    study = table3.Study(tmp_path, tmp_path / "docs", tmp_path / "outputs")
    (tmp_path / "docs").mkdir()
    planned = table3.planned_overrides(["model.n_heads=8"], 2)
    finished_run(study, "heads8", 2, overrides=[o.replace("=8", "=16") for o in planned])
    with pytest.raises(SystemExit, match=r"heads8/seed2/results.json is not the plan's run: it ran with the "
                                         r"overrides\n  experiment=ablation_base model.n_heads=16 seed=2"):
        table3.status(study, ["heads8"])
    assert not (tmp_path / "docs" / "heads8").exists()

    finished_run(study, "heads2", 1, "model.dropout=0.3", "trainer.max_epochs=6")  # the experiment file edited
    with pytest.raises(SystemExit, match=r"heads2/seed1 ran with other settings than the plan composes to now:\n"
                                         r".*model.dropout: 0.3 there, 0.1 in the plan"):
        table3.status(study, ["heads2"])
    assert not (tmp_path / "docs" / "heads2").exists()


def test_a_run_whose_results_hold_a_fingerprint_is_compared_by_it_with_the_precision_it_trained_in(tmp_path):
    """results.json's own results fingerprint decides (not the config re-resolved on this machine): the plan's
    trainer.precision=auto accepts the precision the run's machine gave, and a trainer setting of the results
    (max_epochs) that differs from the plan's is refused."""
    from transformer_nmt.training.fingerprint import PRECISION, RESULTS_FINGERPRINT, results_fingerprint

    study = table3.Study(tmp_path, tmp_path / "docs", tmp_path / "outputs")
    (tmp_path / "docs").mkdir()
    run, results = finished_run(study, "heads8", 2)
    fingerprint = results_fingerprint(OmegaConf.load(run / "config.yaml"))
    fingerprint[PRECISION] = "16-mixed"  # what auto gave on the run's GPU, whatever this machine gives
    (run / "results.json").write_text(json.dumps({**results, RESULTS_FINGERPRINT: fingerprint}))
    table3.check_config(run, {**results, RESULTS_FINGERPRINT: fingerprint}, next(o for c, _, o in table3.PLAN
                                                                               if c == "heads8"), 2)
    fingerprint["trainer.max_epochs"] = 1
    with pytest.raises(SystemExit, match=r"heads8/seed2 ran with other settings than the plan composes to now:\n"
                                         r"  trainer.max_epochs: 1 there, \d+ in the plan"):
        table3.check_config(run, {**results, RESULTS_FINGERPRINT: fingerprint},
                            next(o for c, _, o in table3.PLAN if c == "heads8"), 2)


def test_a_truncated_done_marker_counts_as_missing(tmp_path):
    study = table3.Study(tmp_path, tmp_path / "docs", tmp_path / "outputs")
    kept = tmp_path / "docs" / "heads8" / "seed2"
    kept.mkdir(parents=True)
    (kept / "results.json").write_text('{"overrides": ["experiment=abl')  # an older writer, killed mid-write
    missing = table3.status(study, ["heads8"])
    assert [(cell, seed) for cell, _, seed in missing] == [("heads8", 1), ("heads8", 2)]


def test_every_kept_run_of_the_study_is_the_plans():
    """Every run kept in docs/table3 is the plan's; the paper's rows (base, A-E) are complete (F-H, added since,
    fill in as their runs are kept)."""
    study = table3.Study(DOCS.parent.parent, DOCS, DOCS.parent.parent / "no-outputs")
    paper = {cell for cell, row, _ in table3.PLAN if row in ("base", "A", "B", "C", "D", "E") and
             not cell.startswith(("rotary", "no_positions"))}
    kept = [(cell, overrides, seed) for cell, overrides, seed in table3.runs()
            if (DOCS / cell / f"seed{seed}").is_dir()]
    assert paper <= {cell for cell, _, _ in kept}
    assert all(table3.collect(study, cell, seed, overrides=overrides) for cell, overrides, seed in kept)


def test_every_cell_lands_in_its_row_of_the_summary():
    """The summary assigns each cell, composed as the driver runs it, to the row the plan names."""
    base = summarize_ablation.base_config("ablation_base")
    for cell, row, overrides in table3.PLAN:
        key = summarize_ablation.composed_config("experiment=ablation_base", *overrides)
        assert summarize_ablation.table_row(key, base) == row, cell
