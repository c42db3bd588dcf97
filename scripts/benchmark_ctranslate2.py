"""CTranslate2 against the native search: beam-k translation of the Multi30k test set, float32 and int8
exports, 1 and 2 threads, side by side in one run.

    python scripts/benchmark_ctranslate2.py ckpt=RUN/averaged.ckpt [limit=1000] [beam=4] [max_tokens=4096]

``ctranslate2_engines`` gives the rows as named engines (name -> (baseline name, function from source lines to
translations)), the format of ``scripts/benchmark_decode.py``, which can add them to its own table. Alone,
this script times them against ``translate_lines`` with the native engine: sentences are batched by tokens as
``translate`` does, every batch is translated by each engine in turn (the order rotates from batch to batch),
and "x native" is the median over batches of native-time / engine-time (native at 1 thread).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.ctranslate2_engine import CTranslate2Model
from transformer_nmt.evaluate import score
from transformer_nmt.export import export_model, import_ctranslate2
from transformer_nmt.model import Transformer
from transformer_nmt.options import parse_options
from transformer_nmt.tokenizer import Tokenizer
from transformer_nmt.translate import encode_sources, read_lines, token_batches, translate_lines

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"ckpt": None, "src": None, "ref": None, "max_tokens": 4096, "limit": 1000, "beam": 4}
Engine = Callable[[list[str]], list[str]]


def with_threads(threads: int, engine: Engine) -> Engine:
    """Run ``engine`` with torch on ``threads`` threads, then go back to the number before."""
    def translate(lines: list[str]) -> list[str]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return engine(lines)
        finally:
            torch.set_num_threads(before)
    return translate


def lines_engine(model, tokenizer: Tokenizer, k: int) -> Engine:
    """Lines -> best translations with ``translate_lines`` (native Transformer or CTranslate2Model)."""
    return lambda lines: [hyps[0][0] for hyps in translate_lines(model, tokenizer, lines, beam=k)]


def ctranslate2_engines(model: Transformer, tokenizer: Tokenizer, k: int, baseline: str | None,
                        threads: tuple[int, ...] = (1, 2)) -> dict[str, tuple[str | None, Engine]]:
    """CTranslate2 rows: ``model`` exported as float32 and as int8, each loaded with each number of threads."""
    import_ctranslate2()
    directory = Path(tempfile.mkdtemp(prefix="ct2_benchmark_"))
    rows = {}
    for quantization in ("none", "int8"):
        model_dir = export_model(model, tokenizer, directory / quantization, quantization)
        for n in threads:
            name = f"ctranslate2 {'float32' if quantization == 'none' else quantization}, beam {k}, {n} thread(s)"
            rows[name] = (baseline, lines_engine(CTranslate2Model(model_dir, threads=n), tokenizer, k))
    return rows


def main(argv: list[str]) -> None:
    options = parse_options(argv, OPTIONS)
    torch.set_num_threads(1)
    model, tokenizer, meta = load_checkpoint(options["ckpt"], map_location="cpu")
    data = meta.get("data_config") or {}
    src_lang, tgt_lang = data.get("src_lang", "en"), data.get("tgt_lang", "de")
    test = ROOT / "data" / "multi30k" / "test_2016_flickr"
    sources = read_lines(options["src"] or f"{test}.{src_lang}.gz")[: options["limit"]]
    references = read_lines(options["ref"] or f"{test}.{tgt_lang}.gz")[: options["limit"]]
    lengths = [len(ids) for ids in encode_sources(tokenizer, sources, model.config.max_positions)]
    batches = token_batches(lengths, options["max_tokens"])

    k = options["beam"]
    native = f"native, beam {k}, 1 thread(s)"
    table = {native: (None, lines_engine(model, tokenizer, k)),
             f"native, beam {k}, 2 thread(s)": (native, with_threads(2, lines_engine(model, tokenizer, k))),
             **ctranslate2_engines(model, tokenizer, k, native)}
    names = list(table)
    seconds = {name: [] for name in names}
    outputs = {name: [""] * len(sources) for name in names}
    for n, batch in enumerate(batches):
        lines = [sources[i] for i in batch]
        for name in names[n % len(names):] + names[: n % len(names)]:  # rotate the order
            started = time.perf_counter()
            translations = table[name][1](lines)
            seconds[name].append(time.perf_counter() - started)
            for i, text in zip(batch, translations):
                outputs[name][i] = text
        print(f"batch {n + 1}/{len(batches)} ({len(batch)} sentences)", file=sys.stderr)

    ctranslate2 = import_ctranslate2()
    print(f"{len(sources)} sentences, {len(batches)} batches of <= {options['max_tokens']} source tokens, "
          f"torch {torch.__version__}, ctranslate2 {ctranslate2.__version__}, model d_model {model.config.d_model}, "
          f"{model.config.n_encoder_layers}+{model.config.n_decoder_layers} layers, vocab {model.config.vocab_size}\n")
    print("| engine | sentences/s | x native | same as native | BLEU |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        baseline, total = table[name][0], sum(seconds[name])
        speedup = same = "-"
        if baseline:
            speedup = f"{statistics.median(b / a for a, b in zip(seconds[name], seconds[baseline])):.2f}x"
            same = f"{sum(a == b for a, b in zip(outputs[name], outputs[baseline]))}/{len(sources)}"
        print(f"| {name} | {len(sources) / total:.1f} | {speedup} | {same} | "
              f"{score(outputs[name], references)['bleu']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
