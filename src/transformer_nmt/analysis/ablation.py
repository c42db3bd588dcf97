"""Summarize ablation runs in the layout of the paper's Table 3: one row per configuration, over seeds.

    python -m transformer_nmt.summarize_ablation SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--resamples N] \
        [--metrics bleu chrf ...]
    python -m transformer_nmt.summarize_ablation multirun/ablation_heads/RUN multirun/ablation_base/RUN

Reads every ``results.json`` under the given directories, at any depth (a Hydra sweep's numbered run
directories, or docs/table3/CELL/seedK), groups the runs by configuration (N, d_model, d_ff, h, d_k, d_v,
P_drop, eps_ls, positions), across seeds and across directories, and writes into ``--out`` (default: the first
directory):

- ``ablation.md`` (also printed) and ``ablation.csv``: per configuration its Table 3 row (A-E, by which settings
  differ from the base), dev BLEU (greedy, whole validation set) and perplexity as mean ± sample std over seeds,
  the number of seeds n, the BLEU difference to the base, and p: the paired bootstrap test of sacreBLEU
  (``sacrebleu.significance.PairedTest``, test_type "bs", ``--resamples`` resamples, seed SACREBLEU_SEED, default
  12345) of the run against the base run *of the same seed*, on the same validation sentences; the largest p over
  the seeds both have (identical outputs: p = 1). ✓ marks p < 0.05 (significant under every paired seed).
  The base is the configuration of ``conf/experiment/ablation_base.yaml`` (``--base-experiment``).
- ``bleu_vs_heads.png`` (row A and the base: BLEU against h, error bars ± std), ``bleu_vs_params.png`` (every
  configuration, error bars ± std) and ``ablation_rows.png`` (BLEU difference to the base per configuration,
  the base's ± std as a band).

BLEU is the default of ``--metrics``: any registered metric (metrics/catalog.py) can be named instead or beside it.
Each gets its own columns (NAME (dev), n, ΔNAME, p, p<0.05: the first metric's where BLEU's are above, further ones
after them; in the csv the first metric's as BLEU's are, ``NAME_mean``, ``NAME_std``, ``NAME_n``, ``NAME_p_max``,
``NAME_p_seeds`` for each further one), its own plots (``NAME_vs_heads.png``, ``NAME_vs_params.png``;
``ablation_rows_NAME.png`` for a further one) and a note of its direction where lower is better. A run's value is
its results.json ``val_NAME`` (what training measured), else the metric computed from its hypotheses and the
references (a metric that needs the sources has none then). p is the metric's own paired test
(``Metric.paired_bootstrap``: sacreBLEU's PairedTest for the sacreBLEU metrics, the same bootstrap on sentence values
for a mean of them such as COMET); a metric without one gets none.

Each run's hypotheses are its ``val_hypotheses.txt``; the references, ``val_references.txt`` beside it or in
a directory above it (docs/table3 keeps one copy). Runs without hypotheses get no p-value.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import warnings
from collections import defaultdict
from dataclasses import fields
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from omegaconf import OmegaConf

from transformer_nmt import run_files
from transformer_nmt.metrics import catalog
from transformer_nmt.metrics.base import Metric
from transformer_nmt.metrics.significance import DEFAULT_SEED, SEED_ENV
from transformer_nmt.model.transformer import TransformerConfig

RESULTS, HYPOTHESES, REFERENCES = run_files.RESULTS, run_files.HYPOTHESES, run_files.REFERENCES
DEFAULT_RESAMPLES = 1000
DEFAULT_METRICS = ("bleu",)  # what the summary reports unless --metrics names others
ALPHA = 0.05
# A configuration: (results.json key, column), in the paper's column order.
CONFIG = [("n_layers", "N"), ("d_model", "d_model"), ("d_ff", "d_ff"), ("n_heads", "h"), ("d_k", "d_k"),
          ("d_v", "d_v"), ("dropout", "P_drop"), ("label_smoothing", "eps_ls"), ("positions", "positions")]
# TransformerConfig's fields that CONFIG's columns hold (n_layers is n_encoder_layers; d_k, d_v resolved), and
# those that are not an architecture to compare: the vocabulary (the data's), the pad id, how attention is
# computed, the longest sequence. Every other field of the dataclass is part of a configuration too (EXTRA), by
# name, so that a new model option separates unlike runs without an edit here.
IN_COLUMNS = {"n_encoder_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v", "dropout", "positions"}
NOT_ARCHITECTURE = {"vocab_size", "pad_id", "attention", "attention_block_size", "max_positions"}
EXTRA = [f.name for f in fields(TransformerConfig) if f.name not in IN_COLUMNS | NOT_ARCHITECTURE]
KEYS = [key for key, _ in CONFIG] + EXTRA
ROWS = {  # Table 3's rows: the settings each one changes, alone or together, against the base
    "A": {"n_heads"}, "B": {"d_k", "d_v"}, "C": {"n_layers", "n_decoder_layers", "d_model", "d_ff"},
    "D": {"dropout", "label_smoothing"}, "E": {"positions"},
    # since the paper: the feed-forward (a gated one at equal parameters), the normalisation, all of them at once
    "F": {"activation", "d_ff"}, "G": {"norm", "norm_first"},
    "H": {"positions", "activation", "d_ff", "norm", "norm_first"},
}
ROW_ORDER = ["base", *ROWS, "other"]


# --- runs and configurations -------------------------------------------------------------------

def load_runs(directories: list[Path]) -> list[dict]:
    """Every results.json under ``directories`` (any depth) with ``path`` (its directory) added; the seed
    from results.json (older files: null). Runs trained otherwise than by the settings Table 3 varies are refused
    (``check_one_precision``, ``check_one_training``); a (configuration, seed) met twice then keeps the first, with
    a warning (the same run in two directories)."""
    found = []
    for directory in directories:
        for path in sorted(directory.rglob(RESULTS)):
            run = {**json.loads(path.read_text()), "path": path.parent}
            run["config"] = config_key(run)
            found.append(run)
    if not found:
        raise SystemExit(f"no {RESULTS} under {', '.join(map(str, directories))}: pass sweep directories "
                         f"(multirun/NAME/RUN) or docs/table3, whose subdirectories hold the runs")
    check_one_precision(found)
    check_one_training(found)
    runs, seen = [], {}
    for run in found:
        key = (run["config"], run.get("seed"))
        if run.get("seed") is not None and key in seen:
            warnings.warn(f"{run['path']}: same configuration and seed as {seen[key]}; kept that one")
            continue
        seen[key] = run["path"]
        runs.append(run)
    return runs


# The keys of a run's results fingerprint (results.json's ``fingerprint``: training/fingerprint.py) that a row of
# the table varies: its columns (the architecture's model.* fields, label smoothing) and the seed (a row's n). Every
# other key is a training setting all runs of one table share.
VARIED = {"seed", "data.seed", "train.label_smoothing",
          *(f"model.{name}" for name in {*IN_COLUMNS, *EXTRA, "n_decoder_layers"})}


def check_one_training(runs: list[dict]) -> None:
    """Runs whose results fingerprints differ in a key outside ``VARIED`` (an EMA, BPE-dropout, distilled-data,
    init_from or longer run beside plain ones) are not one experiment: a row would pool them into one mean over
    "seeds". A SystemExit names each differing key with its values, how many runs hold each and one of them. Older
    files without a fingerprint pass (as in ``check_one_precision``)."""
    values: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    fingerprinted = [run for run in runs if isinstance(run.get("fingerprint"), dict)]
    keys = {key for run in fingerprinted for key in run["fingerprint"]} - VARIED
    for run in fingerprinted:
        for key in keys:
            values[key][json.dumps(run["fingerprint"].get(key, "absent"), sort_keys=True)].append(run["path"])
    differing = sorted(key for key in keys if len(values[key]) > 1)
    if not differing:
        return
    shown = "\n".join(f"  {key}: " + "; ".join(f"{value} ({len(paths)} runs, e.g. {paths[0]})"
                                               for value, paths in values[key].items()) for key in differing[:8])
    more = f"\n  and {len(differing) - 8} more" if len(differing) > 8 else ""
    raise SystemExit(f"the runs were trained with different settings outside Table 3's columns (a row would pool "
                     f"them as seeds of one configuration):\n{shown}{more}\nsummarize the runs of one training "
                     f"recipe at a time (pass only their directories)")


def check_one_precision(runs: list[dict]) -> None:
    """Runs trained in different precisions (precision=auto answers per machine) are not one experiment: a
    paired test of a bf16 run against an fp32 one measures the precision too. Older files without it pass."""
    by_precision = {}
    for run in runs:
        if run.get("precision") is not None:
            by_precision.setdefault(run["precision"], []).append(str(run["path"]))
    if len(by_precision) > 1:
        found = "; ".join(f"{precision}: {len(paths)} runs, e.g. {paths[0]}"
                          for precision, paths in by_precision.items())
        raise SystemExit(f"the runs were trained in different precisions ({found}): summarize the runs of one "
                         f"precision at a time, or rerun with trainer.precision set explicitly")


def config_key(run: dict) -> tuple:
    """The configuration of a run, in KEYS' order (CONFIG's columns, then EXTRA's fields): each from results.json's
    ``model`` record, its top-level key, or, for fields older results.json lack, the default (TransformerConfig's,
    what those runs ran with)."""
    per_head = run["d_model"] // run["n_heads"]
    defaults = {"d_v": per_head, "label_smoothing": None, "positions": "sinusoidal",
                **{f.name: f.default for f in fields(TransformerConfig) if f.name in EXTRA},
                "n_decoder_layers": run["n_layers"]}  # N: both stacks
    model = run.get("model") or {}
    return (*(run.get(key, defaults.get(key)) for key, _ in CONFIG),
            *(model.get(name, run.get(name, defaults[name])) for name in EXTRA))


def composed_config(*overrides: str) -> tuple:
    """The configuration key of conf/train.yaml with ``overrides``, composed as the app composes it."""
    from hydra import compose, initialize_config_dir

    from transformer_nmt.conf import CONF_DIR
    from transformer_nmt.model.attention import head_dims
    from transformer_nmt.training.config import register_configs
    from transformer_nmt.training.resolvers import register_resolvers

    register_configs()  # conf/train.yaml composes over the schemas
    register_resolvers()  # experiment recipes use ${by_precision:}
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    model = cfg.model
    d_k, d_v = head_dims(model.d_model, model.n_heads, model.d_k, model.d_v)
    return config_key({"n_layers": model.n_encoder_layers, "d_model": model.d_model, "d_ff": model.d_ff,
                       "n_heads": model.n_heads, "d_k": d_k, "d_v": d_v, "dropout": model.dropout,
                       "label_smoothing": cfg.train.label_smoothing, "positions": model.positions,
                       "model": OmegaConf.to_container(model, resolve=True)})


def base_config(experiment: str) -> tuple:
    """The configuration key of conf/experiment/EXPERIMENT.yaml."""
    return composed_config(f"experiment={experiment}")


def table_row(config: tuple, base: tuple | None) -> str:
    """Which row of Table 3 a configuration belongs to: the settings that differ from the base (d_k, d_v
    count only where they are not d_model / h) fall inside one row's set."""
    if base is None:
        return "other"

    def settings(key: tuple) -> dict:
        values = dict(zip(KEYS, key))
        per_head = values["d_model"] // values["n_heads"]
        for name in ("d_k", "d_v"):
            values[name] = "d_model/h" if values[name] == per_head else values[name]
        return values

    ours, theirs = settings(config), settings(base)
    changed = {name for name in ours if ours[name] != theirs[name]}
    if not changed:
        return "base"
    return next((row for row, names in ROWS.items() if changed <= names), "other")


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation); std None for fewer than 2 values, both None for none."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def run_value(run: dict, metric: str) -> float | None:
    """The run's dev value of ``metric``: results.json's ``val_NAME`` where training measured it, else the metric
    computed from the run's hypotheses and the references (None without them, or for a metric that needs the
    sources, which a run does not keep)."""
    if run.get(f"val_{metric}") is not None:
        return run[f"val_{metric}"]
    hypotheses, references = run["path"] / HYPOTHESES, references_for(run["path"])
    if catalog.metric_class(metric).needs_sources or not hypotheses.is_file() or references is None:
        return None
    return catalog.build(metric).compute(read_lines(hypotheses), read_lines(references)).value


def summarize_groups(runs: list[dict], base: tuple | None, metrics: list[str] = DEFAULT_METRICS) -> list[dict]:
    """One record per configuration: settings, row, n, each metric's and PPL's mean/std (NAME_mean, NAME_std,
    NAME_n; ``n``: the first metric's), parameters, minutes, seeds; ordered base first, then rows A-E, each by its
    settings."""
    groups = defaultdict(list)
    for run in runs:
        groups[run["config"]].append(run)
    records = []
    for config, members in groups.items():
        members.sort(key=lambda r: (r.get("seed") is None, r.get("seed") or 0))
        for run in members:
            run["values"] = {metric: run_value(run, metric) for metric in metrics}
        ppl = [r["val_ppl"] for r in members if r.get("val_ppl") is not None]
        minutes = [r["wall_seconds"] / 60 for r in members if r.get("wall_seconds") is not None]
        record = dict(zip(KEYS, config))
        record.update(config=config, row=table_row(config, base), runs=members,
                      seeds=[r.get("seed") for r in members], parameters=members[0]["parameters"],
                      minutes=statistics.fmean(minutes) if minutes else None)
        for metric in metrics:
            values = [r["values"][metric] for r in members if r["values"][metric] is not None]
            record[f"{metric}_mean"], record[f"{metric}_std"] = mean_std(values)
            record[f"{metric}_n"] = len(values)
        record["n"] = record[f"{metrics[0]}_n"]
        record["ppl_mean"], record["ppl_std"] = mean_std(ppl)
        records.append(record)
    def order(record: dict) -> tuple:  # by row, then by which settings differ from the base, then their values
        config = record["config"]
        changed = tuple(i for i, (v, b) in enumerate(zip(config, base or config)) if v != b)
        return (ROW_ORDER.index(record["row"]), changed,
                [(0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in config])
    return sorted(records, key=order)


# --- significance ------------------------------------------------------------------------------

def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def references_for(run_dir: Path) -> Path | None:
    """val_references.txt beside the run or in the nearest directory above it."""
    for directory in (run_dir, *run_dir.parents):
        if (directory / REFERENCES).is_file():
            return directory / REFERENCES
    return None


def paired_p_values(records: list[dict], resamples: int, metric: str = DEFAULT_METRICS[0]) -> dict:
    """{configuration: (largest p over paired seeds, paired seeds)} against the base, seed by seed: for every
    seed the base has, one paired bootstrap of ``metric`` (its own: ``Metric.paired_bootstrap``; for BLEU,
    sacreBLEU's PairedTest) of the base run (baseline) against every other configuration's run of that seed, on the
    validation sentences both translated (same references, checked). Empty for a metric without a paired test or
    one that needs the sources (the runs keep none)."""
    base = next((r for r in records if r["row"] == "base"), None)
    scorer = catalog.build(metric)
    if base is None or scorer.needs_sources:
        return {}
    os.environ.setdefault(SEED_ENV, DEFAULT_SEED)
    p_values = defaultdict(list)
    for base_run in base["runs"]:
        seed, base_hyps = base_run.get("seed"), base_run["path"] / HYPOTHESES
        references = references_for(base_run["path"])
        if seed is None or not base_hyps.is_file() or references is None:
            continue
        refs = read_lines(references)
        systems = [("base", read_lines(base_hyps))]
        for record in records:
            run = next((r for r in record["runs"] if r.get("seed") == seed), None)
            if record is base or run is None or not (run["path"] / HYPOTHESES).is_file():
                continue
            theirs = references_for(run["path"])
            if theirs is None or read_lines(theirs) != refs:
                raise SystemExit(f"{run['path']}: its validation references differ from the base's "
                                 f"({references}): a paired test needs the same sentences")
            systems.append((record["config"], read_lines(run["path"] / HYPOTHESES)))
        if len(systems) < 2:
            continue
        found = scorer.paired_bootstrap(systems[0][1], [hyps for _, hyps in systems[1:]], refs, resamples=resamples)
        if found is None:
            return {}
        for (config, hyps), p in zip(systems[1:], found):
            # sacreBLEU (after MultEval) counts only resampled differences > the observed one, so identical
            # outputs get p = 1 / (resamples + 1); with nothing different there is nothing to test: p = 1.
            p_values[config].append((1.0 if hyps == systems[0][1] else p, seed))
    return {config: (max(p for p, _ in pairs), [s for _, s in pairs]) for config, pairs in p_values.items()}


# --- output ------------------------------------------------------------------------------------

def fmt(value, spec: str = "{}") -> str:
    return "-" if value is None else spec.format(value)


def cell(mean, std, digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"


def title(metric: str) -> str:
    """The metric's name in a header: "BLEU" for bleu (metrics/: its ``title``)."""
    return catalog.metric_class(metric).heading()


def delta(record: dict, base: dict | None, metric: str) -> float | None:
    """The configuration's mean of ``metric`` less the base's (None for the base itself, or where either is
    missing)."""
    if base is None or record is base or record[f"{metric}_mean"] is None or base[f"{metric}_mean"] is None:
        return None
    return record[f"{metric}_mean"] - base[f"{metric}_mean"]


def markdown_table(records: list[dict], p_values: dict, metrics: list[str] = DEFAULT_METRICS) -> str:
    """The paper's layout: settings equal to the base's are left blank (all shown in the base row); per metric its
    mean ± std, n, the difference to the base, p and the ✓ (``p_values``: {metric: paired_p_values'})."""
    base = next((r for r in records if r["row"] == "base"), None)
    others = any(extra_changes(r, base) for r in records)  # a column for EXTRA's fields where any run sets one
    header = ["", *(name for _, name in CONFIG), *(["other"] if others else []), "params", "PPL (dev)",
              *(column for metric in metrics for column in (f"{title(metric)} (dev)", "n", f"Δ{title(metric)}", "p",
                                                            "p<0.05"))]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for record in records:
        settings = [("" if base is not None and record is not base and record[key] == base[key] else str(record[key]))
                    for key, _ in CONFIG] + ([extra_changes(record, base)] if others else [])
        columns = []
        for metric in metrics:
            p = p_values.get(metric, {}).get(record["config"])
            columns += [cell(record[f"{metric}_mean"], record[f"{metric}_std"]), str(record[f"{metric}_n"]),
                        fmt(delta(record, base, metric), "{:+.2f}"), fmt(p and p[0], "{:.3f}"),
                        ("✓" if p[0] < ALPHA else "") if p else ""]
        lines.append("| " + " | ".join([
            record["row"], *settings, f"{record['parameters']:,}", cell(record["ppl_mean"], record["ppl_std"]),
            *columns]) + " |")
    return "\n".join(lines) + "\n"


def notes(records: list[dict], resamples: int, metrics: list[str] = DEFAULT_METRICS) -> str:
    """What the table's columns mean, each metric's direction where lower is better and its paired test where it
    is not sacreBLEU's, and the base's noise."""
    base = next((r for r in records if r["row"] == "base"), None)
    hypotheses = [r["path"] / HYPOTHESES for r in (base or records[0])["runs"] if (r["path"] / HYPOTHESES).is_file()]
    sentences = f"{len(read_lines(hypotheses[0])):,} validation sentences" if hypotheses else "the validation set"
    titles = [title(metric) for metric in metrics]
    listed = " and ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 1 else titles)
    text = [f"\n{', '.join(titles)} and PPL: mean ± sample std over n seeds (dev: greedy {listed} on {sentences}). "
            f"p: paired "
            f"bootstrap (sacrebleu.significance.PairedTest, {resamples} resamples, seed {SEED_ENV}="
            f"{os.environ.get(SEED_ENV, DEFAULT_SEED)}) of each configuration's run against the base run of the same "
            f"seed; the largest p over the seeds both have. ✓: p < {ALPHA} under every paired seed."]
    for metric in metrics:
        cls = catalog.metric_class(metric)
        if not cls.higher_is_better:
            text.append(f"{title(metric)}: lower is better (a negative Δ{title(metric)} is an improvement).")
        if cls.needs_sources:
            text.append(f"{title(metric)}: no p (it needs the source sentences, which the runs do not keep).")
        elif cls.paired_bootstrap is Metric.paired_bootstrap:
            text.append(f"{title(metric)}: p from the same bootstrap over its sentence values "
                        f"(metrics/significance.py); none where it has no sentence values.")
    if base is not None and base["n"]:
        for metric in metrics:
            values = [r["values"][metric] for r in base["runs"] if r["values"][metric] is not None]
            if values:
                text.append(f"Base noise: n={base[f'{metric}_n']} seeds, {title(metric)} "
                            f"{cell(base[f'{metric}_mean'], base[f'{metric}_std'])}, range "
                            f"{min(values):.2f}-{max(values):.2f}.")
    else:
        text.append(f"No run of the base configuration: no {', '.join('Δ' + title(m) for m in metrics)} and no "
                    f"p-values.")
    return "\n".join(text) + "\n"


def write_csv(records: list[dict], p_values: dict, path: Path, metrics: list[str] = DEFAULT_METRICS) -> None:
    """One line per configuration; an ``other`` column (EXTRA's fields that differ from the base, as the markdown
    table's) where any configuration sets one. The first metric's columns are NAME_mean, NAME_std, n, seeds, p_max,
    p_seeds; each further metric's come last: NAME_mean, NAME_std, NAME_n, NAME_p_max, NAME_p_seeds."""
    base = next((r for r in records if r["row"] == "base"), None)
    others = any(extra_changes(r, base) for r in records)
    first, *further = metrics
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", *(name for _, name in CONFIG), *(["other"] if others else []), "params", "ppl_mean",
                         "ppl_std", f"{first}_mean", f"{first}_std", "n", "seeds", "p_max", "p_seeds", "minutes_mean",
                         *(f"{m}_{c}" for m in further for c in ("mean", "std", "n", "p_max", "p_seeds"))])
        for r in records:
            p = p_values.get(first, {}).get(r["config"])
            row = [r["row"], *(r[key] for key, _ in CONFIG), *([extra_changes(r, base)] if others else []),
                   r["parameters"], *(_raw(r[k]) for k in ("ppl_mean", "ppl_std", f"{first}_mean", f"{first}_std")),
                   r["n"], " ".join(map(str, r["seeds"])), _raw(p[0]) if p else "",
                   " ".join(map(str, p[1])) if p else "", _raw(r["minutes"])]
            for metric in further:
                p = p_values.get(metric, {}).get(r["config"])
                row += [_raw(r[f"{metric}_mean"]), _raw(r[f"{metric}_std"]), r[f"{metric}_n"],
                        _raw(p[0]) if p else "", " ".join(map(str, p[1])) if p else ""]
            writer.writerow(row)


def _raw(value):
    return "" if value is None else round(value, 4) if isinstance(value, float) else value


def _errorbar(ax, points, **kwargs):
    xs, ys, errs = zip(*points)
    ax.errorbar(xs, ys, yerr=[e or 0.0 for e in errs], marker="o", capsize=3, **kwargs)


def axis_label(metric: str) -> str:
    """A plot's axis for ``metric``: "BLEU (dev, greedy), mean ± std", and its direction where lower is better."""
    lower = "" if catalog.higher_is_better(metric) else "; lower is better"
    return f"{title(metric)} (dev, greedy), mean ± std{lower}"


def plot_vs_heads(records: list[dict], path: Path, metric: str = DEFAULT_METRICS[0]) -> None:
    """Dev ``metric`` ± std against h, one line per model shape (N, d_model, d_ff) among the runs with
    d_k = d_model / h."""
    mean, std = f"{metric}_mean", f"{metric}_std"
    fig, ax = plt.subplots(figsize=(5, 3.5))
    shapes = defaultdict(list)
    for r in records:
        per_head = r["d_model"] // r["n_heads"]
        if r[mean] is not None and r["d_k"] == per_head and r["row"] in ("base", "A", "other"):
            shapes[(r["n_layers"], r["d_model"], r["d_ff"], r["dropout"], r["label_smoothing"], r["positions"])].append(
                (r["n_heads"], r[mean], r[std]))
    for (n_layers, d_model, d_ff, *_), points in sorted(shapes.items(), key=lambda kv: str(kv[0])):
        _errorbar(ax, sorted(points), label=f"N {n_layers}, d_model {d_model}, d_ff {d_ff}")
    heads = sorted({r["n_heads"] for r in records})
    ax.set_xscale("log", base=2)
    ax.set_xticks(heads, [str(h) for h in heads])
    ax.minorticks_off()
    ax.set_xlabel("attention heads h (d_k = d_v = d_model / h)")
    ax.set_ylabel(axis_label(metric))
    ax.grid(alpha=0.3)
    if shapes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def extra_changes(record: dict, base: dict | None) -> str:
    """EXTRA's fields where ``record`` differs from the base (or, without one, from TransformerConfig's defaults):
    "activation=swiglu norm=rmsnorm"."""
    defaults = {f.name: f.default for f in fields(TransformerConfig)}
    reference = base if base is not None else defaults

    def shown(name: str) -> bool:
        if name == "n_decoder_layers":  # N is both stacks' depth: a decoder of another depth than N is a change
            return record[name] != record["n_layers"]
        return record[name] != reference[name]

    return " ".join(f"{name}={record[name]}" for name in EXTRA if shown(name))


def label(record: dict, base: dict | None) -> str:
    if base is None or record is base:
        return "base" if record is base else "h{n_heads} d{d_model} N{n_layers} ff{d_ff}".format(**record)
    names = dict(CONFIG)
    return " ".join([*(f"{names[k]}={record[k]}" for k, _ in CONFIG if record[k] != base[k]),
                     *filter(None, [extra_changes(record, base)])])


def plot_vs_params(records: list[dict], path: Path, metric: str = DEFAULT_METRICS[0]) -> None:
    """Dev ``metric`` ± std against parameters. The cells whose parameter count differs from the base's each get a
    marker and a legend entry (the one setting they change, the first in Table 3's order); those with the base's
    count (h, P_drop, ε_ls) share its x and are drawn grey as one legend entry: labels on the points would pile up."""
    mean, std = f"{metric}_mean", f"{metric}_std"
    fig, ax = plt.subplots(figsize=(7.5, 4))
    base = next((r for r in records if r["row"] == "base"), None)
    points = [r for r in records if r[mean] is not None]
    names = dict(CONFIG)
    same, labelled = [], []
    for r in points:
        (same if base is not None and r is not base and r["parameters"] == base["parameters"] else labelled).append(r)
    if same:
        ax.errorbar([r["parameters"] for r in same], [r[mean] for r in same],
                    yerr=[r[std] or 0.0 for r in same], fmt="o", capsize=3, color="#999999", alpha=0.7,
                    label=f"{len(same)} cells with the base's parameters (h, P_drop, ε_ls)")
    markers, colors = "osD^vP*Xhp<>", [f"C{k}" for k in range(10) if k != 7]  # C7 is grey, the same-count cells'
    for i, r in enumerate(sorted(labelled, key=lambda r: (r["parameters"], r[mean]))):
        if r is base:
            text = "base"
        else:
            key = next((k for k, _ in CONFIG if r[k] != base[k]), None) if base is not None else None
            text = f"{names[key]} {r[key]}" if key and not extra_changes(r, base) else label(r, base)
        ax.errorbar(r["parameters"], r[mean], yerr=r[std] or 0.0, fmt=markers[i % len(markers)],
                    capsize=3, color="black" if r is base else colors[i % len(colors)],
                    label=f"{text} ({r['parameters'] / 1e6:.2f}M)")
    ax.set_xscale("log")
    ax.set_xlabel("parameters (log scale)")
    ax.set_ylabel(axis_label(metric))
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))  # beside the plot: points stay visible
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_rows(records: list[dict], p_values: dict, path: Path, metric: str = DEFAULT_METRICS[0]) -> None:
    """Δ``metric`` to the base per configuration (± its std), grouped by row; the base's ± std as a grey band
    (``p_values``: the metric's paired_p_values)."""
    mean, std = f"{metric}_mean", f"{metric}_std"
    base = next((r for r in records if r["row"] == "base"), None)
    others = [r for r in records if r is not base and r[mean] is not None]
    fig, ax = plt.subplots(figsize=(6, 1.6 + 0.3 * max(len(others), 1)))
    if base is not None and base[mean] is not None:
        ax.axvspan(-(base[std] or 0.0), base[std] or 0.0, color="grey", alpha=0.25,
                   label=f"base ± std (n={base[f'{metric}_n']})")
        ax.axvline(0.0, color="grey", lw=1)
        for y, r in enumerate(others):
            p = p_values.get(r["config"])
            ax.errorbar(r[mean] - base[mean], y, xerr=r[std] or 0.0, marker="o", capsize=3,
                        color="C3" if p and p[0] < ALPHA else "C0")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(range(len(others)), [f"({r['row']}) {label(r, base)}" for r in others], fontsize=7)
    ax.invert_yaxis()
    lower = "" if catalog.higher_is_better(metric) else " (lower is better)"
    ax.set_xlabel(f"Δ{title(metric)} (dev) to the base{lower}; red: p < 0.05 under every paired seed", fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarize(directories: list[Path], out: Path, resamples: int = DEFAULT_RESAMPLES,
              base_experiment: str = "ablation_base", metrics: list[str] = DEFAULT_METRICS) -> str:
    """Write ablation.md, ablation.csv and the plots into ``out``, for each of ``metrics`` (registered names, the
    first one's in the columns BLEU's have by default); returns the markdown."""
    metrics = catalog.check_names(metrics, "metrics")
    if not metrics:
        raise SystemExit("metrics: name at least one registered metric (" + ", ".join(catalog.names()) + ")")
    runs = load_runs(directories)
    records = summarize_groups(runs, base_config(base_experiment), metrics)
    p_values = {metric: paired_p_values(records, resamples, metric) for metric in metrics}
    text = markdown_table(records, p_values, metrics) + notes(records, resamples, metrics)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.md").write_text(text, encoding="utf-8")
    write_csv(records, p_values, out / "ablation.csv", metrics)
    for number, metric in enumerate(metrics):
        plot_vs_heads(records, out / f"{metric}_vs_heads.png", metric)
        plot_vs_params(records, out / f"{metric}_vs_params.png", metric)
        plot_rows(records, p_values[metric], out / ("ablation_rows.png" if number == 0 else
                                                    f"ablation_rows_{metric}.png"), metric)
    return text


def add_metrics_option(parser: argparse.ArgumentParser) -> None:
    """``--metrics NAME ...``: the registered metrics to summarize (summarize_ablation's and table3's)."""
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS), metavar="NAME",
                        help="the registered metrics to summarize, each with its columns, plots and paired test: "
                             + ", ".join(catalog.names()) + f" (default: {' '.join(DEFAULT_METRICS)})")


def metrics(parser: argparse.ArgumentParser, args) -> list[str]:
    """``--metrics`` checked against the registry; a usage error naming the unknown one."""
    try:
        return catalog.check_names(args.metrics, "--metrics")
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> None:
    """The command line of transformer_nmt.summarize_ablation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directories", nargs="+", type=Path, metavar="SWEEP_DIR")
    parser.add_argument("--out", type=Path, help="where the table and plots go (default: the first SWEEP_DIR)")
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="paired bootstrap resamples")
    parser.add_argument("--base-experiment", default="ablation_base",
                        help="the experiment whose configuration is the base (conf/experiment/NAME.yaml)")
    add_metrics_option(parser)
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.directories if not d.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    text = summarize(args.directories, args.out or args.directories[0], args.resamples, args.base_experiment,
                     metrics(parser, args))
    print(text, end="")

