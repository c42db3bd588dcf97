"""transformer_nmt.analysis.table3 (scripts/table3.py) without training: the plan covers every row of Table 3
with the seeds the study needs, and a finished run's small files are kept under docs/table3 once, with the machine
it ran on."""

import json

import transformer_nmt.analysis.ablation as summarize_ablation
import transformer_nmt.analysis.table3 as table3


def test_the_plan_has_every_row_five_base_seeds_and_two_for_every_other_cell():
    rows = {row for _, row, _ in table3.PLAN}
    assert rows == {"base", "A", "B", "C", "D", "E"}
    planned = table3.runs()
    assert sorted(seed for cell, _, seed in planned if cell == "base") == [1, 2, 3, 4, 5]
    others = {cell for cell, _, _ in table3.PLAN} - {"base"}
    assert all(sorted(s for c, _, s in planned if c == cell) == [1, 2] for cell in others)
    assert all(len(overrides) == 1 for cell, _, overrides in table3.PLAN if cell != "base")  # one change a cell
    assert len(planned) == 5 + 2 * len(others)


def test_a_finished_run_is_collected_once_with_its_machine(tmp_path, capsys):
    study = table3.Study(tmp_path, tmp_path / "docs", tmp_path / "outputs")
    run = tmp_path / "outputs" / "heads8" / "seed2"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"seed": 2, "wall_seconds": 330.0}))
    (run / "val_hypotheses.txt").write_text("ein hund\n")
    (run / "val_references.txt").write_text("ein hund rennt\n")
    (tmp_path / "docs").mkdir()

    missing = table3.status(study, ["heads8"])
    assert [(cell, seed) for cell, _, seed in missing] == [("heads8", 1)]  # seed 2 finished: collected, not rerun
    kept = tmp_path / "docs" / "heads8" / "seed2"
    assert (kept / "val_hypotheses.txt").read_text() == "ein hund\n"
    assert (tmp_path / "docs" / "val_references.txt").read_text() == "ein hund rennt\n"  # once, above the runs
    results = json.loads((kept / "results.json").read_text())
    assert results["seed"] == 2 and results["machine"]["cpus"] >= 1
    assert "1 of 2 runs done (0.1 h of wall time so far), about 0.1 h left at 5.5 min a run (median)" in capsys.readouterr().out


def test_every_cell_lands_in_its_row_of_the_summary():
    """The summary assigns each cell, composed as the driver runs it, to the row the plan names."""
    base = summarize_ablation.base_config("ablation_base")
    for cell, row, overrides in table3.PLAN:
        key = summarize_ablation.composed_config("experiment=ablation_base", *overrides)
        assert summarize_ablation.table_row(key, base) == row, cell
