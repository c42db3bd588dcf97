"""Evaluate a checkpoint: detokenized hypotheses to a file, its metrics (sacreBLEU's BLEU and chrF by default) to JSON
beside it.

    python -m transformer_nmt.evaluate ckpt=RUN/averaged.ckpt split=test
    python -m transformer_nmt.evaluate ckpt=model.ckpt src=newstest2014.en ref=newstest2014.de

``split=val|test`` reads that split of the data the checkpoint was trained on (its data config travels in the
checkpoint), every pair, unfiltered; ``src=FILE ref=FILE`` scores any pair of plain-text files (``.gz`` too). What
a checkpoint records never chooses a path on its own: the recorded locations are read only when they are relative
paths inside the directory evaluate runs in (where the data of one's own runs lives, ``data/multi30k/...``) and the
checkpoint itself lies inside that directory (one's own run, ``outputs/...``), or with ``trust_data_paths=true``;
any other is refused with the recorded path shown (a recorded Hub dataset name too). ``ckpt=[A,B,...]`` scores the
ensemble of those checkpoints (its first one's data and directory are used). Beam and engine options as in
``translate`` (``--help`` lists them with their defaults; ``engine=ctranslate2`` with ``ckpt`` or ``model_dir``).
Writes to ``out=DIR`` (default: ``eval/`` beside the checkpoint) ``NAME.hyp`` (one line per source line),
``NAME.ref`` and ``NAME.json`` (each written to a temporary file beside it, fsynced, then renamed over it: a
symbolic link in its place is replaced, never written through; a warning names an earlier evaluation of another
checkpoint it replaces; one that is a file evaluate reads, ``src=``, ``ref=`` or a checkpoint, is refused) with
each metric of ``metrics=[...]`` (registered in metrics/, default: sacreBLEU's BLEU cased and lowercased, with the
length ratio and brevity penalty, and chrF, and the Multi30k literature's BLEU) under its name, with its signature
under NAME_signature, so ``sacrebleu NAME.ref -i NAME.hyp`` reproduces a sacreBLEU metric exactly: both are scored
as written, one line each (``one_line``: a line break inside a sentence, a lone CR included, is written as a space);
``bleu_multi30k`` is lowercased and Moses-tokenized (metrics/multi30k.py, needs the optional sacremoses); ``chrfpp``,
``ter`` and ``comet`` (``metric.comet.model=DIR``, a local COMET model; metrics/comet.py) on request; and what made
the file (``provenance``: commit, versions, machine, command, options).

    python -m transformer_nmt.evaluate ckpt=model.ckpt split=test metrics=[bleu,chrf,ter,comet] \
        metric.comet.model=wmt22-comet-da metric.comet.encoder=xlm-roberta-large
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePath
from typing import Optional

import torch

from transformer_nmt import run_files
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.corpus import ReadStats, read_pairs
from transformer_nmt.data.language_tags import Direction, LanguageTags
from transformer_nmt.durable import atomic_write
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.inference.directions import direction_of

# one_line: the score is computed on these lines (sacreBLEU's tokenizers split words at whitespace, and a line break
# is whitespace to them too)
from transformer_nmt.inference.translate import (
    SAMPLING_OPTIONS,
    ModelOptions,
    checkpoint_reads,
    load_model,
    one_line,
    plain_line,
    read_by,
    read_lines,
    translate_lines,
)
from transformer_nmt.metrics import catalog
from transformer_nmt.options import command_argv, option, parse_options, require_checkpoint, values_of
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

USAGE = "python -m transformer_nmt.evaluate ckpt=PATH (split=val|test | src=FILE ref=FILE) [key=value ...]"
REPORTED = ["bleu", "bleu_lowercase", "chrf", "bleu_multi30k"]  # the metrics evaluate writes unless told otherwise


@dataclass
class EvaluateOptions(ModelOptions):
    split: Optional[str] = option(None, "val | test: that split of the checkpoint's own data (or src= and ref=)")
    src: Optional[str] = option(None, "source file, one sentence a line (.gz too), with ref=")
    ref: Optional[str] = option(None, "reference file, one translation a line, with src=")
    out: Optional[str] = option(None, "output directory; null: eval/ beside the checkpoint")
    name: Optional[str] = option(None, "output file names NAME.hyp, .ref, .json; null: the split or the src file")
    lang: Optional[str] = option(None, "target language for bleu_multi30k's Moses tokenizer; null: the "
                                       "checkpoint's data.tgt_lang")
    metrics: list[str] = option(REPORTED, "the registered metrics to compute, each written under its name with "
                                          "NAME_signature: " + ", ".join(catalog.names()) + " (metrics/)")
    metric: catalog.MetricOptions = option(help="each metric's settings: metric.comet.model=DIR ...",
                                           factory=catalog.MetricOptions)
    trust_data_paths: bool = option(False, "split=: read the data locations the checkpoint records even where they "
                                           "are absolute or lead out of this directory (only for a checkpoint you "
                                           "trust); false: only relative paths inside the directory evaluate runs in, "
                                           "of a checkpoint that lies inside it too")


OPTIONS = EvaluateOptions


def outside_launch_dir(location: str) -> bool:
    """Whether ``location``, a path a file from elsewhere records, may lead out of the directory this process runs
    in: an absolute path, a ``~`` path, or one with a ``..`` component. (Symbolic links inside that directory
    are its owner's, and followed.)"""
    path = PurePath(location)
    return path.is_absolute() or location.startswith("~") or ".." in path.parts


def inside_launch_dir(path: str | os.PathLike) -> bool:
    """Whether the file ``path`` (its real location, links resolved) lies inside the directory this process runs
    in: a checkpoint there (``outputs/...``) is taken as one's own run's, whose recorded data one may be taken to
    have named."""
    launch_dir, real = os.path.realpath(os.getcwd()), os.path.realpath(path)
    return os.path.commonpath([launch_dir, real]) == launch_dir


def recorded_locations(config: DataConfig, split: str) -> dict[str, str]:
    """{option: path} of what reading ``split`` of ``config`` opens: the split's file or prefix, or for
    format=hub the dataset directory (``hub_name``; its split is a name, not a path)."""
    if config.format == "hub":
        return {"data.hub_name": config.hub_name or ""}
    location = config.corpus_spec().locations.get(split)
    option_name = "data.val" if split == "val" and isinstance(config.val, (list, tuple)) else f"data.{split}"
    return {option_name: location or ""}


def split_pairs(meta: dict, split: str, trust_paths: bool = False, pair: str | None = None
                ) -> tuple[list[str], list[str]]:
    """All source and reference sentences (unfiltered) of a split of a checkpoint's own training data;
    ``meta`` as returned by ``load_checkpoint``. The recorded locations (a file, a prefix, a Hub dataset's name) are
    read only when they stay inside the working directory (``outside_launch_dir``) and the checkpoint lies inside it
    too (``inside_launch_dir``: one's own run), or with ``trust_paths``; else a SystemExit shows them. ``pair``: one
    direction of a model of several (data.pairs, ``en-fr``)."""
    source = meta.get("source") or f"checkpoint {meta['path']}"
    if meta.get("data_config") is None:
        raise SystemExit(f"{source} does not record its data config; give src=FILE ref=FILE instead")
    try:  # read as data options, never instantiated: a checkpoint must not name code to run
        config = DataConfig.from_record(meta["data_config"], source, meta.get("version"))
    except ValueError as error:
        raise SystemExit(str(error)) from None
    try:
        spec = config.pair_specs()[pair] if pair else config.corpus_spec()  # language codes checked (check_lang)
    except ValueError as error:
        raise SystemExit(f"{source}: {error}") from None
    for key, location in recorded_locations(config, split).items():
        if trust_paths or not location:
            continue
        if outside_launch_dir(location):
            raise SystemExit(f"{source} records {key}={location!r}, a path outside the directory evaluate runs in "
                             f"({Path.cwd()}): a recorded path is read only when it is relative and inside it. Give "
                             f"the files you mean with src=FILE ref=FILE, run evaluate from the directory the "
                             f"checkpoint's data paths are relative to, or pass trust_data_paths=true to read "
                             f"{location!r} (only for a checkpoint you trust)")
        if not inside_launch_dir(meta["path"]):  # a file from elsewhere: its record names none of the user's files
            what = ("a dataset evaluate would fetch from the Hub (or read here)" if key == "data.hub_name"
                    else "a path inside the directory evaluate runs in")
            raise SystemExit(f"{source} records {key}={location!r}, {what}, and lies outside the directory evaluate "
                             f"runs in ({Path.cwd()}): the recorded data of a checkpoint from elsewhere is not "
                             f"read (it would choose what evaluate reads and copies into its outputs). Give the "
                             f"files you mean with src=FILE ref=FILE, run evaluate from a directory the checkpoint "
                             f"lies in (one's own run: outputs/...), or pass trust_data_paths=true to read "
                             f"{location!r} (only for a checkpoint you trust)")
    sources, references = [], []
    for src_chunk, tgt_chunk in read_pairs(spec, split, ReadStats()):
        sources.extend(src_chunk)
        references.extend(tgt_chunk)
    return sources, references


def evaluation_pairs(options, meta: dict, pair: str | None = None) -> tuple[list[str], list[str], str]:
    """(sources, references, default output name) from ``split=val|test`` (the checkpoint's own data,
    ``meta`` from ``load_checkpoint``; ``pair``: one direction of a model of several, whose name the output's
    takes) or from ``src=FILE ref=FILE`` (``options``: evaluate's or analyze_heads'); errors say which options to
    give."""
    if options.split:
        if options.split not in ("val", "test"):
            raise SystemExit(f"split={options.split!r}: use val or test (or src=FILE ref=FILE)")
        sources, references = split_pairs(meta, options.split, getattr(options, "trust_data_paths", False), pair)
        name = options.split if pair is None else f"{options.split}.{pair}"
    elif options.src and options.ref:
        sources, references = read_lines(options.src), read_lines(options.ref)
        name = Path(options.src).name.removesuffix(".gz")
    else:
        raise SystemExit("give split=val|test, or src=FILE ref=FILE")
    if len(sources) != len(references):
        raise SystemExit(f"{len(sources)} source lines but {len(references)} reference lines")
    if not any(reference.strip() for reference in references):
        where = f"ref={options.ref}" if not options.split else f"split={options.split} of {meta.get('path')}"
        raise SystemExit(f"{where}: every reference line is blank ({len(references)} lines): there is nothing to "
                         f"score against; give the references of the source")
    return sources, references, name


def metric_record(hypotheses: list[str], references: list[str], lang: str | None = None, metrics=REPORTED,
                  sources: list[str] | None = None, options=None) -> dict:
    """Each of ``metrics`` (registered names; metrics/catalog.py) over the corpus, rounded to 4 decimals, with its
    signature under NAME_signature and its details beside it (the cased BLEU's length ratio, hypothesis / reference
    tokens, and brevity penalty). ``lang``: the target language (``bleu_multi30k``'s Moses tokenizer);
    ``sources``: for the metrics that need them (COMET); ``options``: a ``catalog.MetricOptions``."""
    if not any(reference.strip() for reference in references):  # sacreBLEU would divide by 0 reference tokens
        raise ValueError(f"every reference line is blank ({len(references)} lines): there is nothing to score against")
    results = catalog.compute(metrics, hypotheses, references, sources, options, lang)
    written = {}
    for name, result in results.items():
        written[name] = None if result.value is None else round(result.value, 4)
        written.update({key: round(value, 4) for key, value in result.details.items()})
        written[f"{name}_signature"] = result.signature
    return written


score = metric_record  # its older name (studies and benchmarks import it); "scores" are log-probabilities now


def metric_values(hypotheses, references, sources, lang, options: EvaluateOptions) -> dict:
    """``metric_record`` with evaluate's options; a metric's refusal (a COMET directory that is not one) is a SystemExit
    naming it."""
    try:
        return metric_record(hypotheses, references, lang, options.metrics, sources, options.metric)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def default_out_dir(checkpoint: str | os.PathLike) -> Path:
    """``eval/`` beside ``checkpoint``: where evaluate writes when ``out=`` is not given. A symbolic link there
    (which whoever can write beside the checkpoint may plant) is refused: evaluate writes only where its user
    named a directory, or into a real one beside the checkpoint."""
    out_dir = Path(checkpoint).parent / run_files.EVAL
    if out_dir.is_symlink():
        raise SystemExit(f"{out_dir} is a symbolic link (to {os.readlink(out_dir)}): evaluate writes its files beside "
                         f"the checkpoint only into a real directory; remove the link, or name the directory to "
                         f"write to with out=DIR")
    return out_dir


def warn_replacing(path: Path, ckpt) -> None:
    """A warning on stderr where ``path`` (NAME.json) holds an evaluation of another checkpoint than ``ckpt``, which
    this one replaces with its NAME.hyp, .ref and .json (``name=`` keeps both)."""
    current = ckpt if isinstance(ckpt, list) else str(ckpt)
    try:
        earlier = json.loads(path.read_text(encoding="utf-8")).get("checkpoint")
        shown = repr(earlier)  # what the file says, as a Python literal: no escape sequence reaches a terminal
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError):
        earlier, shown = None, "a file that is not a readable evaluation"
    if earlier != current:
        print(f"warning: {path} holds the evaluation of {shown}; replacing it with that of {current} (give name=NAME "
              f"to keep both)", file=sys.stderr)


OUTPUT_SUFFIXES = (".hyp", ".ref", ".json")


def check_outputs(options: EvaluateOptions, out_dir: Path, name: str) -> None:
    """A SystemExit where one of the files evaluate writes (``OUT/NAME.hyp``, ``.ref``, ``.json``) is a file it reads
    (``src=``, ``ref=``, a checkpoint of ``ckpt=``, a file of ``model_dir=``): another spelling, a symbolic or a hard
    link of it too (translate.same_file). Replacing it would destroy the input (``src=D/t.hyp out=D name=t``)."""
    reads = [("src", options.src), ("ref", options.ref), *checkpoint_reads(options.ckpt)]
    if options.model_dir and Path(options.model_dir).is_dir():
        reads += [("model_dir", str(path)) for path in sorted(Path(options.model_dir).iterdir()) if path.is_file()]
    for suffix in OUTPUT_SUFFIXES:
        output = out_dir / f"{name}{suffix}"
        read = read_by(output, reads)
        if read is not None:
            raise SystemExit(f"out={out_dir} name={name} writes {output}, which is the file {read[0]}={read[1]} "
                             f"names: evaluate would replace its own input; give another out=DIR or name=NAME")


def write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8) to ``path`` atomically (durable.atomic_write): a temporary file beside it, fsynced, renamed
    over it; a symbolic link at ``path`` is replaced by the file, its target left as it was."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def main(argv: list[str] | None = None) -> dict:
    options = parse_options(command_argv(argv), EvaluateOptions, __doc__, USAGE)
    require_checkpoint(options)
    try:  # before decoding: a misnamed metric or a COMET directory that is not one stops here
        for metric_name in catalog.check_names(options.metrics):
            catalog.build(metric_name, options.metric).check()
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if options.n_best != 1:
        raise SystemExit(f"n_best={options.n_best}: evaluate scores each line's best translation; n_best is "
                         f"translate's and synthesize's")
    model, tokenizer, meta = load_model(options)
    tags = LanguageTags.of(meta.get("data_config"))
    if tags is not None and options.split and not (options.src_lang or options.tgt_lang):
        return evaluate_pairs(options, model, tokenizer, meta, tags)  # every direction of the model, one call
    direction = direction_of(options, meta)
    return evaluate_direction(options, model, tokenizer, meta, direction)


def evaluate_direction(options: EvaluateOptions, model, tokenizer, meta: dict, direction: Direction | None,
                       name: str | None = None) -> dict:
    """Translate and score one direction (the model's only one where ``direction`` is None), write NAME.hyp, .ref
    and .json (``name``: in place of name= or the default), and return what NAME.json holds."""
    ckpt = options.ckpt or options.model_dir
    first = ckpt[0] if isinstance(ckpt, list) else ckpt
    pair = direction.name if direction is not None and options.split else None  # its part of the split
    sources, references, default_name = evaluation_pairs(options, meta, pair)
    name = name or options.name or default_name
    out_dir = Path(options.out) if options.out else default_out_dir(first)
    check_outputs(options, out_dir, name)  # before decoding: nothing it reads is written over

    decode = values_of(DecodeConfig, options)
    started = time.perf_counter()
    hypotheses = [hyps[0][0] for hyps in translate_lines(model, tokenizer, sources, decode, direction=direction)]
    seconds = time.perf_counter() - started
    # What is scored is what is written: sacrebleu NAME.ref -i NAME.hyp reads the same lines, the same count. The
    # hypotheses as translate writes them (plain_line: no control character either); the references as given.
    hypotheses, references = [plain_line(h) for h in hypotheses], [one_line(r) for r in references]

    warn_replacing(out_dir / f"{name}.json", ckpt)
    write_text(out_dir / f"{name}.hyp", "".join(h + "\n" for h in hypotheses))
    write_text(out_dir / f"{name}.ref", "".join(r + "\n" for r in references))
    lang = options.lang or (direction.tgt if direction is not None else  # the language it translates into
                            (meta.get("data_config") or {}).get("tgt_lang"))
    result = {"checkpoint": ckpt if isinstance(ckpt, list) else str(ckpt), "sentences": len(sources),
              **({"direction": direction.record()} if direction is not None else {}),
              **metric_values(hypotheses, references, sources, lang, options),
              "engine": options.engine, "compute_type": options.compute_type,
              "threads": getattr(model, "threads", torch.get_num_threads()),
              "inter_threads": getattr(model, "inter_threads", None),
              "beam": decode.beam, "alpha": decode.alpha, "length_penalty": decode.length_penalty,
              "max_len_offset": decode.max_len_offset,
              # sampled translations score otherwise than searched ones: what drew them, beside the score
              **({"sampling": {k: getattr(decode, k) for k in SAMPLING_OPTIONS}}
                 if decode.sampling else {}),
              "decode_seconds": round(seconds, 1), "global_step": meta.get("global_step"),
              PROVENANCE_KEY: collect_provenance(config={"options": asdict(options)})}
    write_text(out_dir / f"{name}.json", json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


PAIR_SUMMARY = ("sentences", "bleu", "bleu_lowercase", "bleu_multi30k", "chrf", "length_ratio", "bp")


def evaluate_pairs(options: EvaluateOptions, model, tokenizer, meta: dict, tags: LanguageTags) -> dict:
    """``split=`` of a model of several pairs: each direction scored as one (NAME.en-de.hyp, .ref, .json; NAME:
    name= or the split), and NAME.json summing them up: each pair's scores and, under the scores' own names, their
    means over the pairs (what a reader of one pair's NAME.json, reproduce, ranks by)."""
    results, base = {}, options.name or options.split
    for src, tgt in tags.pairs:
        result = evaluate_direction(options, model, tokenizer, meta, tags.direction(src, tgt), f"{base}.{src}-{tgt}")
        summary_keys = (*PAIR_SUMMARY, *options.metrics)  # the metrics asked for (metrics=[...]) too
        results[f"{src}-{tgt}"] = {key: result[key] for key in dict.fromkeys(summary_keys) if key in result}
    ckpt = options.ckpt or options.model_dir
    first = ckpt[0] if isinstance(ckpt, list) else ckpt
    out_dir = Path(options.out) if options.out else default_out_dir(first)
    means = {key: round(sum(r[key] for r in results.values()) / len(results), 4)
             for key in dict.fromkeys((*PAIR_SUMMARY[1:], *options.metrics))
             if all(isinstance(r.get(key), (int, float)) for r in results.values())}
    summary = {"checkpoint": ckpt if isinstance(ckpt, list) else str(ckpt), "split": options.split,
               "pairs": results, "mean_over_pairs": True, **means,
               "sentences": sum(r["sentences"] for r in results.values()), "beam": options.beam,
               PROVENANCE_KEY: collect_provenance(config={"options": asdict(options)})}
    write_text(out_dir / f"{base}.json", json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != PROVENANCE_KEY}, indent=2))
    return summary


if __name__ == "__main__":
    main()
