"""scripts/summarize_ablation.py on synthetic results.json files: table, CSV and plots, no training."""

import csv
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "summarize_ablation.py"


def write_run(sweep: Path, job: int, n_heads: int, val_bleu: float | None, parameters: int = 1_949_696,
              d_model: int = 128) -> None:
    """One run directory as transformer_nmt.train leaves it (only results.json matters here)."""
    run = sweep / str(job)
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({
        "overrides": ["experiment=ablation_heads", f"model.n_heads={n_heads}"],
        "n_heads": n_heads, "d_model": d_model, "d_k": d_model // n_heads, "n_layers": 2, "n_decoder_layers": 2,
        "d_ff": 512, "dropout": 0.2, "parameters": parameters, "val_loss": 3.1, "val_ppl": 5.0 + n_heads / 100,
        "val_bleu": val_bleu, "test_bleu": None, "train_tgt_tokens_per_sec": 10000.0 - n_heads, "steps": 700,
        "wall_seconds": 300.0 + n_heads * 6,
    }))


def test_table_csv_and_plots_from_a_sweep_directory(tmp_path):
    sweep = tmp_path / "multirun" / "ablation_heads" / "2025-01-01_00-00-00"
    bleu = {1: 20.5, 2: 22.25, 4: 23.0, 8: 22.75, 16: None}  # h=16: no validation ran
    for job, h in enumerate([16, 4, 1, 8, 2]):  # job numbers out of h order: the table sorts
        write_run(sweep, job, h, bleu[h])
    (sweep / "multirun.yaml").write_text("{}")  # Hydra's own files beside the runs are ignored

    result = subprocess.run([sys.executable, str(SCRIPT), str(sweep)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr

    table = (sweep / "ablation.md").read_text()
    assert result.stdout == table
    lines = table.splitlines()
    assert lines[0] == ("| h | d_k | d_model | N | d_ff | params | PPL (dev) | BLEU (dev) | tokens/s | minutes |")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [row[0] for row in rows] == ["1", "2", "4", "8", "16"]  # same parameter count: ordered by h
    assert rows[0] == ["1", "128", "128", "2", "512", "1,949,696", "5.01", "20.50", "9,999", "5.1"]
    assert rows[2][:2] == ["4", "32"] and rows[2][7] == "23.00"
    assert rows[4][7] == "-"  # missing BLEU

    with open(sweep / "ablation.csv", newline="") as f:
        records = list(csv.DictReader(f))
    assert [r["h"] for r in records] == ["1", "2", "4", "8", "16"]
    assert records[1]["BLEU (dev)"] == "22.25" and records[1]["params"] == "1949696" and records[1]["d_k"] == "64"
    assert records[1]["minutes"] == "5.2" and records[1]["run"] == "4"
    assert records[4]["BLEU (dev)"] == ""

    for name in ("bleu_vs_heads.png", "bleu_vs_params.png"):
        png = (sweep / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 1000, name


def test_rows_are_ordered_by_parameters_then_heads(tmp_path):
    write_run(tmp_path, 0, 4, 25.0, parameters=7_600_000, d_model=256)
    write_run(tmp_path, 1, 8, 21.0, parameters=1_949_696)
    write_run(tmp_path, 2, 2, 20.0, parameters=1_949_696)
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [line.split("|")[1:4] for line in result.stdout.splitlines()[2:]]
    assert [[c.strip() for c in row] for row in rows] == [["2", "64", "128"], ["8", "16", "128"], ["4", "64", "256"]]


def test_a_directory_without_results_is_an_error_that_says_what_to_pass(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no */results.json" in result.stderr
