"""Score a checkpoint with sacreBLEU: detokenized hypotheses to a file, BLEU and chrF to JSON beside it.

    python -m transformer_nmt.evaluate ckpt=RUN/averaged.ckpt split=test
    python -m transformer_nmt.evaluate ckpt=model.ckpt src=newstest2014.en ref=newstest2014.de

``split=val|test`` reads that split of the data the checkpoint was trained on (its data config travels
in the checkpoint), every pair, unfiltered; ``src=FILE ref=FILE`` scores any pair of plain-text files
(``.gz`` too). ``ckpt=[A,B,...]`` scores the ensemble of those checkpoints (its first one's data and
directory are used). Beam and engine options as in ``translate`` (``--help`` lists them with their defaults;
``engine=ctranslate2`` with ``ckpt`` or ``model_dir``). Writes to
``out=DIR`` (default: ``eval/`` beside the checkpoint) ``NAME.hyp`` (one line per source line),
``NAME.ref`` and ``NAME.json`` with sacreBLEU's BLEU (cased and lowercased, with the length ratio and
brevity penalty) and chrF and their signatures, so ``sacrebleu NAME.ref -i NAME.hyp`` reproduces the score
exactly: both are scored as written, one line each (``one_line``: a line break inside a sentence, a lone CR
included, is written as a space); the Multi30k literature's BLEU (``bleu_multi30k``: lowercased, Moses-tokenized;
inference/multi30k_bleu.py, needs the optional sacremoses); and what made the file (``provenance``: commit,
versions, machine, command, options).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
from sacrebleu.metrics import BLEU, CHRF

from transformer_nmt import run_files
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.corpus import ReadStats, read_pairs
from transformer_nmt.inference.decode_config import DecodeConfig
from transformer_nmt.inference.multi30k_bleu import multi30k_bleu
from transformer_nmt.inference.translate import ModelOptions, load_model, read_lines, translate_lines
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance
from transformer_nmt.options import command_argv, option, parse_options, require_checkpoint, values_of

USAGE = "python -m transformer_nmt.evaluate ckpt=PATH (split=val|test | src=FILE ref=FILE) [key=value ...]"


@dataclass
class EvaluateOptions(ModelOptions):
    split: Optional[str] = option(None, "val | test: that split of the checkpoint's own data (or src= and ref=)")
    src: Optional[str] = option(None, "source file, one sentence a line (.gz too), with ref=")
    ref: Optional[str] = option(None, "reference file, one translation a line, with src=")
    out: Optional[str] = option(None, "output directory; null: eval/ beside the checkpoint")
    name: Optional[str] = option(None, "output file names NAME.hyp, .ref, .json; null: the split or the src file")
    lang: Optional[str] = option(None, "target language for bleu_multi30k's Moses tokenizer; null: the "
                                       "checkpoint's data.tgt_lang")


OPTIONS = EvaluateOptions


def split_pairs(meta: dict, split: str) -> tuple[list[str], list[str]]:
    """All source and reference sentences (unfiltered) of a split of a checkpoint's own training data;
    ``meta`` as returned by ``load_checkpoint``."""
    if meta.get("data_config") is None:
        raise SystemExit(f"checkpoint {meta['path']} does not record its data config; give src=FILE ref=FILE instead")
    try:  # read as data options, never instantiated: a checkpoint must not name code to run
        source = meta.get("source") or f"checkpoint {meta['path']}"
        spec = DataConfig.from_record(meta["data_config"], source, meta.get("version")).corpus_spec()
    except ValueError as error:
        raise SystemExit(str(error)) from None
    sources, references = [], []
    for src_chunk, tgt_chunk in read_pairs(spec, split, ReadStats()):
        sources.extend(src_chunk)
        references.extend(tgt_chunk)
    return sources, references


def evaluation_pairs(options, meta: dict) -> tuple[list[str], list[str], str]:
    """(sources, references, default output name) from ``split=val|test`` (the checkpoint's own data,
    ``meta`` from ``load_checkpoint``) or from ``src=FILE ref=FILE`` (``options``: evaluate's or analyze_heads');
    errors say which options to give."""
    if options.split:
        if options.split not in ("val", "test"):
            raise SystemExit(f"split={options.split!r}: use val or test (or src=FILE ref=FILE)")
        sources, references = split_pairs(meta, options.split)
        name = options.split
    elif options.src and options.ref:
        sources, references = read_lines(options.src), read_lines(options.ref)
        name = Path(options.src).name.removesuffix(".gz")
    else:
        raise SystemExit("give split=val|test, or src=FILE ref=FILE")
    if len(sources) != len(references):
        raise SystemExit(f"{len(sources)} source lines but {len(references)} reference lines")
    return sources, references, name


def one_line(text: str) -> str:
    """``text`` as one line of a file that any reader splits as we do: every line boundary ``str.splitlines``
    knows (a lone CR, LF, VT, FF, U+001C-U+001E, NEL, U+2028, U+2029) becomes a space, and trailing whitespace,
    which sacrebleu's command line strips, goes. The score is computed on these lines (sacreBLEU's tokenizers
    split words at whitespace, and a line break is whitespace to them too)."""
    return " ".join(text.splitlines()).rstrip()


def score(hypotheses: list[str], references: list[str], lang: str | None = None) -> dict:
    """sacreBLEU BLEU (cased and lowercased) and chrF, with their signatures; beside the cased BLEU its
    length ratio (hypothesis / reference tokens) and brevity penalty; and the Multi30k literature's BLEU
    (``bleu_multi30k``: lowercased, Moses-tokenized for the target language ``lang``; multi30k_bleu.py)."""
    metrics = {}
    for name, metric in (("bleu", BLEU()), ("bleu_lowercase", BLEU(lowercase=True)), ("chrf", CHRF())):
        result = metric.corpus_score(hypotheses, [references])
        metrics[name] = round(result.score, 4)
        if name == "bleu":
            metrics["length_ratio"], metrics["bp"] = round(result.sys_len / result.ref_len, 4), round(result.bp, 4)
        metrics[f"{name}_signature"] = str(metric.get_signature())
    return {**metrics, **multi30k_bleu(hypotheses, references, lang)}


def main(argv: list[str] | None = None) -> dict:
    options = parse_options(command_argv(argv), EvaluateOptions, __doc__, USAGE)
    require_checkpoint(options)
    model, tokenizer, meta = load_model(options)
    ckpt = options.ckpt or options.model_dir
    first = ckpt[0] if isinstance(ckpt, list) else ckpt
    sources, references, default_name = evaluation_pairs(options, meta)
    name = options.name or default_name

    decode = values_of(DecodeConfig, options)
    started = time.perf_counter()
    hypotheses = [hyps[0][0] for hyps in translate_lines(model, tokenizer, sources, decode)]
    seconds = time.perf_counter() - started
    # What is scored is what is written: sacrebleu NAME.ref -i NAME.hyp reads the same lines, the same count
    hypotheses, references = [one_line(h) for h in hypotheses], [one_line(r) for r in references]

    out_dir = Path(options.out or Path(first).parent / run_files.EVAL)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.hyp").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    (out_dir / f"{name}.ref").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    lang = options.lang or (meta.get("data_config") or {}).get("tgt_lang")  # the language it translates into
    result = {"checkpoint": ckpt if isinstance(ckpt, list) else str(ckpt), "sentences": len(sources),
              **score(hypotheses, references, lang),
              "engine": options.engine, "compute_type": options.compute_type,
              "threads": getattr(model, "threads", torch.get_num_threads()),
              "inter_threads": getattr(model, "inter_threads", None),
              "beam": decode.beam, "alpha": decode.alpha, "length_penalty": decode.length_penalty,
              "max_len_offset": decode.max_len_offset,
              "decode_seconds": round(seconds, 1), "global_step": meta.get("global_step"),
              PROVENANCE_KEY: collect_provenance(config={"options": asdict(options)})}
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
