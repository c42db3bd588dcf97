"""Summarize a sweep in the shape of the paper's Table 3: one row per run, from each run's results.json.

    python scripts/summarize_ablation.py multirun/ablation_heads/2025-01-01_12-00-00

Reads ``DIR/*/results.json`` (written by ``transformer_nmt.train`` into every run directory) and writes
into DIR:
- ``ablation.md`` (also printed) and ``ablation.csv``: h, d_k, d_model, N, d_ff, parameters, dev perplexity,
  dev BLEU (greedy, whole validation set), training target tokens/s, minutes of wall time; rows ordered by
  parameter count, then h;
- ``bleu_vs_heads.png``: dev BLEU against h (log2 axis), one line per model shape (d_model, N, d_ff);
- ``bleu_vs_params.png``: dev BLEU against the parameter count (log axis), points labelled with h.
Runs without a value (e.g. no validation ran) show "-" in the table, an empty CSV cell, and no point.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (column, results.json key, markdown format); the CSV holds the raw values.
COLUMNS = [
    ("h", "n_heads", "{:d}"),
    ("d_k", "d_k", "{:d}"),
    ("d_model", "d_model", "{:d}"),
    ("N", "n_layers", "{:d}"),
    ("d_ff", "d_ff", "{:d}"),
    ("params", "parameters", "{:,}"),
    ("PPL (dev)", "val_ppl", "{:.2f}"),
    ("BLEU (dev)", "val_bleu", "{:.2f}"),
    ("tokens/s", "train_tgt_tokens_per_sec", "{:,.0f}"),
    ("minutes", "minutes", "{:.1f}"),
]


def load_results(sweep_dir: Path) -> list[dict]:
    """Every ``sweep_dir/*/results.json``, with ``run`` (the subdirectory) and ``minutes`` added,
    ordered by parameter count, then h."""
    runs = []
    for path in sorted(sweep_dir.glob("*/results.json")):
        result = json.loads(path.read_text())
        seconds = result.get("wall_seconds")
        runs.append({**result, "run": path.parent.name, "minutes": seconds / 60 if seconds is not None else None})
    if not runs:
        raise SystemExit(f"no */results.json under {sweep_dir}: pass the sweep directory (multirun/NAME/TIME), "
                         f"whose numbered subdirectories are the runs")
    return sorted(runs, key=lambda r: (r["parameters"], r["n_heads"], r["run"]))


def markdown_table(runs: list[dict]) -> str:
    lines = ["| " + " | ".join(name for name, _, _ in COLUMNS) + " |",
             "| " + " | ".join("---" for _ in COLUMNS) + " |"]
    for run in runs:
        cells = [fmt.format(run[key]) if run.get(key) is not None else "-" for _, key, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(runs: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([name for name, _, _ in COLUMNS] + ["run"])
        for run in runs:
            writer.writerow([_raw(run.get(key)) for _, key, _ in COLUMNS] + [run["run"]])


def _raw(value):
    if value is None:
        return ""
    return round(value, 4) if isinstance(value, float) else value


def plot_bleu_vs_heads(runs: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    shapes = sorted({(r["d_model"], r["n_layers"], r["d_ff"]) for r in runs})
    for d_model, n_layers, d_ff in shapes:
        points = sorted((r["n_heads"], r["val_bleu"]) for r in runs if r.get("val_bleu") is not None
                        and (r["d_model"], r["n_layers"], r["d_ff"]) == (d_model, n_layers, d_ff))
        if points:
            ax.plot(*zip(*points), marker="o", label=f"d_model {d_model}, N {n_layers}, d_ff {d_ff}")
    heads = sorted({r["n_heads"] for r in runs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(heads, [str(h) for h in heads])
    ax.minorticks_off()
    ax.set_xlabel("attention heads h (d_k = d_model / h)")
    ax.set_ylabel("BLEU (dev, greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bleu_vs_params(runs: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    points = [r for r in runs if r.get("val_bleu") is not None]
    ax.scatter([r["parameters"] for r in points], [r["val_bleu"] for r in points])
    for r in points:
        ax.annotate(f"h{r['n_heads']} d{r['d_model']} N{r['n_layers']} ff{r['d_ff']}",
                    (r["parameters"], r["val_bleu"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("BLEU (dev, greedy)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarize(sweep_dir: Path) -> str:
    """Write ablation.md, ablation.csv and the two plots into ``sweep_dir``; returns the markdown table."""
    runs = load_results(sweep_dir)
    table = markdown_table(runs)
    (sweep_dir / "ablation.md").write_text(table)
    write_csv(runs, sweep_dir / "ablation.csv")
    plot_bleu_vs_heads(runs, sweep_dir / "bleu_vs_heads.png")
    plot_bleu_vs_params(runs, sweep_dir / "bleu_vs_params.png")
    return table


def main(argv: list[str]) -> None:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        raise SystemExit(f"usage: python {Path(__file__).name} MULTIRUN_DIR   (e.g. multirun/ablation_heads/TIME)")
    print(summarize(Path(argv[0])), end="")


if __name__ == "__main__":
    main(sys.argv[1:])
