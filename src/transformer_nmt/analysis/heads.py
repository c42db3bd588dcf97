"""Head importance: silence one attention head at a time, measure what BLEU (or another metric) and loss lose.

After Michel, Levy and Neubig (2019), "Are Sixteen Heads Really Better than One?": each head's output
is multiplied by a gate (1 = on, 0 = off) at evaluation, with no retraining (head_gates.py).

    python -m transformer_nmt.analyze_heads ckpt=RUN/checkpoints/last.ckpt split=val max_sentences=300
    python -m transformer_nmt.analyze_heads ckpt=model.ckpt src=val.en ref=val.de
    python -m transformer_nmt.analyze_heads ckpt=multi.ckpt split=val tgt_lang=fr   # one direction of data.pairs

Writes to ``out=DIR`` (default ``heads/`` beside the checkpoint):
- ``head_importance.csv`` and ``.md``: per (kind, layer, head) the BLEU and loss with that head masked and
  their change from the full model; kinds are ``encoder`` (self), ``decoder`` (self) and ``cross``;
- ``head_importance.png``: heatmaps of the BLEU change, one panel per kind (layers x heads);
- ``pruning.csv`` and ``pruning.png``: BLEU as heads are removed, least important first (importance =
  loss increase when the head alone is masked), in ``steps`` equal fractions of all heads.
BLEU is greedy (``beam=1``, fast) unless ``beam`` says otherwise; loss is the mean per-token
cross-entropy of the references under teacher forcing.

``metrics=[bleu,chrf,...]`` (registered names, metrics/; default ``[bleu]``) measures each of them instead: the
tables get NAME and delta_NAME columns for each, the heatmaps and the pruning plot show the first one, coloured by
its direction (red where masking makes it worse: a lower value for BLEU, a higher one for TER).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from transformer_nmt.analysis.head_gates import KINDS, all_heads, set_gates
from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.language_tags import Direction
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.config import DecodeConfig, SearchConfig
from transformer_nmt.inference.batches import token_batches
from transformer_nmt.inference.directions import DirectionOptions, direction_of
from transformer_nmt.inference.evaluate import EvaluateOptions, evaluation_pairs
from transformer_nmt.inference.translate import encode_sources, translate_lines
from transformer_nmt.metrics import catalog
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.options import command_argv, option, option_of, parse_options, require_checkpoint, values_of

USAGE = "python -m transformer_nmt.analyze_heads ckpt=PATH (split=val|test | src=FILE ref=FILE) [key=value ...]"
DEFAULT_METRICS = ["bleu"]  # what is measured unless metrics= names others


@dataclass
class HeadsOptions(SearchConfig):
    """The search's settings (SearchConfig; greedy by default, fast), the evaluation pairs, the study's."""

    ckpt: Optional[str] = option(None, "a checkpoint written by python -m transformer_nmt.train")
    split: Optional[str] = option_of(EvaluateOptions, "split")
    src: Optional[str] = option_of(EvaluateOptions, "src")
    ref: Optional[str] = option_of(EvaluateOptions, "ref")
    trust_data_paths: bool = option_of(EvaluateOptions, "trust_data_paths")
    src_lang: Optional[str] = option_of(DirectionOptions, "src_lang")
    tgt_lang: Optional[str] = option_of(DirectionOptions, "tgt_lang")
    zero_shot: bool = option_of(DirectionOptions, "zero_shot")
    out: Optional[str] = option(None, "output directory; null: heads/ beside the checkpoint")
    max_sentences: int = option(300, "the first this many sentences; 0: all")
    beam: int = option_of(DecodeConfig, "beam", default=1, help="beam size of the BLEU decoding; 1: greedy (fast)")
    steps: int = option(10, "the pruning curve's points: heads removed in this many equal fractions")
    metrics: list[str] = option(DEFAULT_METRICS, "the registered metrics measured with each head masked (the first is "
                                          "plotted): " + ", ".join(catalog.names()) + " (metrics/)")
    metric: catalog.MetricOptions = option(help="each metric's settings: metric.comet.model=DIR ...",
                                           factory=catalog.MetricOptions)


OPTIONS = HeadsOptions


@torch.no_grad()
def reference_loss(model: Transformer, tokenizer: Tokenizer, sources: list[str], references: list[str],
                   max_tokens: int, direction: Direction | None = None) -> float:
    """Mean cross-entropy per reference token (teacher forcing, no label smoothing); ``direction``: a tagged
    model's, its ids as training read them (the source's tag; style decoder, the target's tag after bos)."""
    max_positions = model.config.max_positions
    src_ids = encode_sources(tokenizer, sources, max_positions, direction=direction)
    lead = [] if direction is None else direction.decoder_prefix(tokenizer)
    tgt_ids = [[tokenizer.bos_id] + (lead + ids)[: max_positions - 2] + [tokenizer.eos_id]
               for ids in tokenizer.encode_batch(references, target=True)]
    keep = [i for i, ids in enumerate(src_ids) if ids is not None]
    total, count = 0.0, 0
    device = model.device
    for batch in token_batches([max(len(src_ids[i]), len(tgt_ids[i])) for i in keep], max_tokens):
        rows = [keep[j] for j in batch]
        src = _pad([src_ids[i] for i in rows], model.config.pad_id).to(device)
        tgt = _pad([tgt_ids[i] for i in rows], model.config.pad_id).to(device)
        logits = model(src, tgt[:, :-1])  # (B, T, V)
        total += F.cross_entropy(logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), ignore_index=model.config.pad_id,
                                 reduction="sum").item()
        count += int((tgt[:, 1:] != model.config.pad_id).sum())
    return total / max(count, 1)


def _pad(rows: list[list[int]], pad_id: int) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def measure(model, tokenizer, sources, references, decode: DecodeConfig,
            metrics=None, direction: Direction | None = None) -> tuple[dict[str, float], float]:
    """({name: value} of each of ``metrics``, loss) of the model as currently gated: the metrics of a ``decode``
    search's output (``metrics``: built ``Metric`` objects; None: BLEU), the loss of the references;
    ``direction``: a tagged model's (inference/directions.py), as translate reads it."""
    metrics = metrics or [catalog.build(name) for name in DEFAULT_METRICS]
    hypotheses = [h[0][0] for h in translate_lines(model, tokenizer, sources, decode, direction=direction)]
    return ({metric.name: metric.compute(hypotheses, references, sources).value for metric in metrics},
            reference_loss(model, tokenizer, sources, references, decode.max_tokens, direction))


def shown(values: dict[str, float], base: dict[str, float] | None = None, width: int = 0) -> str:
    """"BLEU 27.31" (", chrF 55.02" ...), each ``width`` wide, with its change from ``base`` where given."""
    return ", ".join(f"{catalog.metric_class(name).heading()} {value:{width}.2f}" +
                     (f" ({value - base[name]:+.2f})" if base is not None else "") for name, value in values.items())


def head_ablation(model, tokenizer, sources, references, decode: DecodeConfig, log=print,
                  metrics=None, direction: Direction | None = None) -> tuple[dict, list]:
    """Each metric of ``metrics`` (built ``Metric`` objects; None: BLEU) of a ``decode`` search, and the loss, of
    the full model, then with each head masked alone."""
    set_gates(model, set())
    base_values, base_loss = measure(model, tokenizer, sources, references, decode, metrics, direction)
    log(f"full model: {shown(base_values)}, loss {base_loss:.4f} on {len(sources)} sentences")
    rows = []
    for kind, layer, head in all_heads(model):
        set_gates(model, {(kind, layer, head)})
        values, loss = measure(model, tokenizer, sources, references, decode, metrics, direction)
        rows.append({"kind": kind, "layer": layer, "head": head, **values, "loss": loss,
                     **{f"delta_{name}": value - base_values[name] for name, value in values.items()},
                     "delta_loss": loss - base_loss})
        log(f"  {kind:7s} layer {layer} head {head}: {shown(values, base_values, width=6)}, "
            f"loss {loss:.4f} ({loss - base_loss:+.4f})")
    set_gates(model, set())
    return {**base_values, "loss": base_loss}, rows


def pruning_order(rows: list[dict]) -> list[tuple[str, int, int]]:
    """(kind, layer, head), least important first: smallest loss increase when masked alone."""
    return [(r["kind"], int(r["layer"]), int(r["head"])) for r in sorted(rows, key=lambda r: float(r["delta_loss"]))]


def read_importance(path: str | Path, model: Transformer) -> list[dict]:
    """The rows of a ``head_importance.csv`` that ``main`` wrote for ``model``: one row per head of the model, or
    an error naming the file (another model's file, or not analyze_heads' table)."""
    if not Path(path).is_file():
        raise SystemExit(f"{path} does not exist: write it with python -m transformer_nmt.analyze_heads ckpt=...")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        heads = [(r["kind"], int(r["layer"]), int(r["head"])) for r in rows]
        pruning_order(rows)  # reads delta_loss
    except (KeyError, TypeError, ValueError):
        raise SystemExit(f"{path} is not a head importance table (columns kind, layer, head, delta_loss, as "
                         "python -m transformer_nmt.analyze_heads writes it)") from None
    if sorted(heads) != sorted(all_heads(model)):
        unknown, missing = sorted(set(heads) - set(all_heads(model))), sorted(set(all_heads(model)) - set(heads))
        raise SystemExit(f"{path} does not rank this model's heads, one row each (not in the model: {unknown}; "
                         f"missing: {missing}; {len(heads)} rows for {len(all_heads(model))} heads): write it for "
                         "this checkpoint with python -m transformer_nmt.analyze_heads ckpt=...")
    return rows


def pruned_heads(rows: list[dict], fraction: float) -> set[tuple[str, int, int]]:
    """The ``round(fraction x heads)`` least important heads (``pruning_order``), ``fraction`` from 0 to 1."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"prune={fraction!r}: give the fraction of heads to remove, a number from 0 to 1")
    order = pruning_order(rows)
    return set(order[: round(fraction * len(order))])


def pruning_curve(model, tokenizer, sources, references, rows, steps: int, decode: DecodeConfig, log=print,
                  metrics=None, direction: Direction | None = None):
    """Remove heads least important first (smallest loss increase alone); each of ``metrics`` (built ``Metric``
    objects; None: BLEU) of a ``decode`` search at ``steps`` fractions."""
    curve = []
    for step in range(steps + 1):
        removed = pruned_heads(rows, step / steps)
        set_gates(model, removed)
        values, loss = measure(model, tokenizer, sources, references, decode, metrics, direction)
        curve.append({"fraction_removed": len(removed) / len(rows), "heads_removed": len(removed), **values,
                      "loss": loss})
        log(f"  pruned {len(removed):3d}/{len(rows)} heads: {shown(values)}, loss {loss:.4f}")
    set_gates(model, set())
    return curve


def measured(base: dict) -> list[str]:
    """The metrics' names in a result of ``head_ablation`` (its base: every key but the loss), in order."""
    return [name for name in base if name != "loss"]


def write_table(rows: list[dict], base: dict, out_dir: Path) -> None:
    with open(out_dir / "head_importance.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    names = measured(base)
    titles = [catalog.metric_class(name).heading() for name in names]
    lines = ["Full model: " + ", ".join(f"{t} {base[name]:.2f}" for t, name in zip(titles, names)) +
             f", loss {base['loss']:.4f}.", "",
             "| kind | layer | head | " + " | ".join(f"{t} masked | change" for t in titles) +
             " | loss masked | change |",
             "| --- | --- | --- | " + "--- | --- | " * len(names) + "--- | --- |"]
    lines += [f"| {r['kind']} | {r['layer']} | {r['head']} | " +
              "".join(f"{r[name]:.2f} | {r['delta_' + name]:+.2f} | " for name in names) +
              f"{r['loss']:.4f} | {r['delta_loss']:+.4f} |" for r in rows]
    (out_dir / "head_importance.md").write_text("\n".join(lines) + "\n")


def plot_heatmaps(rows: list[dict], out_path: Path, metric: str = "bleu") -> None:
    """Each head's change of ``metric`` when masked alone, one panel per kind; red where the metric gets worse
    (in its direction: down for BLEU, up for TER)."""
    delta = f"delta_{metric}"
    fig, axes = plt.subplots(1, len(KINDS), figsize=(4 * len(KINDS), 3.2), squeeze=False)
    limit = max(abs(r[delta]) for r in rows) or 1.0
    for ax, kind in zip(axes[0], KINDS):
        kind_rows = [r for r in rows if r["kind"] == kind]
        n_layers = max(r["layer"] for r in kind_rows) + 1
        n_heads = max(r["head"] for r in kind_rows) + 1
        grid = torch.zeros(n_layers, n_heads)
        for r in kind_rows:
            grid[r["layer"], r["head"]] = r[delta]
        cmap = "RdBu" if catalog.higher_is_better(metric) else "RdBu_r"  # red: worse, either way
        image = ax.imshow(grid, cmap=cmap, vmin=-limit, vmax=limit)
        for r in kind_rows:
            ax.text(r["head"], r["layer"], f"{r[delta]:+.1f}", ha="center", va="center", fontsize=8)
        ax.set_title(f"{kind} attention")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
    fig.colorbar(image, ax=axes[0].tolist(), label=f"{catalog.metric_class(metric).heading()} change when masked")
    fig.savefig(out_path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_pruning(curve: list[dict], out_path: Path, metric: str = "bleu") -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([100 * c["fraction_removed"] for c in curve], [c[metric] for c in curve], marker="o")
    ax.set_xlabel("% of attention heads removed (least important first)")
    ax.set_ylabel(catalog.metric_class(metric).heading() +
                  ("" if catalog.higher_is_better(metric) else " (lower is better)"))
    ax.grid(alpha=0.3)
    fig.savefig(out_path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def built_metrics(options: HeadsOptions) -> list:
    """The metrics of ``metrics=``, built with their ``metric.NAME`` settings and checked; a SystemExit naming the
    option where one is unknown, named twice or cannot work."""
    try:
        names = catalog.check_names(options.metrics)
        if not names:
            raise ValueError("metrics=[]: name at least one registered metric (" + ", ".join(catalog.names()) + ")")
        built = [catalog.build(name, options.metric) for name in names]
        for metric in built:
            metric.check()
    except ValueError as error:
        raise SystemExit(str(error)) from None
    return built


def main(argv: list[str] | None = None) -> dict:
    options = parse_options(command_argv(argv), HeadsOptions, __doc__, USAGE)
    require_checkpoint(options)
    ckpt = options.ckpt
    metrics = built_metrics(options)  # a misnamed metric or a COMET directory that is not one stops here
    model, tokenizer, meta = load_checkpoint(ckpt, map_location=options.device)
    direction = direction_of(options, meta)  # a model of several pairs: the one src_lang= / tgt_lang= choose
    tgt_lang = direction.tgt if direction is not None else (meta.get("data_config") or {}).get("tgt_lang")
    for metric in metrics:  # for a metric whose tokenizer depends on the target language
        metric.tgt_lang = tgt_lang
    sources, references, _ = evaluation_pairs(options, meta, direction.name if direction and options.split else None)
    n = options.max_sentences
    sources, references = (sources[:n], references[:n]) if n else (sources, references)
    out_dir = Path(options.out or Path(ckpt).parent / "heads")
    out_dir.mkdir(parents=True, exist_ok=True)
    decode = values_of(DecodeConfig, options)  # beam and max_tokens from the options, the rest DecodeConfig's
    base, rows = head_ablation(model, tokenizer, sources, references, decode, metrics=metrics, direction=direction)
    write_table(rows, base, out_dir)
    plot_heatmaps(rows, out_dir / "head_importance.png", metrics[0].name)
    curve = pruning_curve(model, tokenizer, sources, references, rows, options.steps, decode, metrics=metrics,
                          direction=direction)
    with open(out_dir / "pruning.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(curve[0]))
        writer.writeheader()
        writer.writerows(curve)
    plot_pruning(curve, out_dir / "pruning.png", metrics[0].name)
    print(f"wrote {out_dir}/head_importance.{{csv,md,png}} and pruning.{{csv,png}}")
    return {"base": base, "heads": rows, "pruning": curve}


if __name__ == "__main__":
    main()
