"""Decoding speed on the 1,000 Multi30k test sentences, two tables, each from one run in one process.

    python benchmarks/benchmark_decode.py ckpt=RUN/checkpoints/averaged.ckpt [max_tokens=4096] [limit=1000] [beam=4]
        [rounds=1] [threads=[2,1]] [ctranslate2=true] [tables=[serving,search]]

``serving`` (what a user of ``translate``/``evaluate`` gets): for beam ``beam`` and for greedy, the native
engine against ``engine=ctranslate2`` as exported (float32) and quantized at load (``compute_type=int8``), at
each thread count of ``threads``: native rows on that many torch threads, CTranslate2 rows with
``intra_threads`` that many and, for more than one, also 1 intra-op thread x that many ``inter_threads``.
Every row translates all the sentences in one ``translate_lines`` call, as ``evaluate`` does (which batches
them by ``max_tokens``; CTranslate2 spreads its batches over its ``inter_threads``), once per round, the order
of the rows rotating from round to round. "seconds" is the median time of a pass; "x native" the median over
rounds of native time / row time, native at the same search and thread count; "same" counts outputs identical
to that native row's; "busy threads" is the median over rounds of the threads of this process that ran at least
a quarter of the pass (read from /proc), so a row that does not use the threads it names shows it. BLEU
against ``ref``.

``search`` (the history of our search): the per-sentence search this project had (benchmarks/baselines.py), the
batched one of decoding.py (``after``) under both stopping rules, the batched searches as they were before issue 31
(ensembles, prefixes, log-probabilities: "before issue 31", against today's), our default on more threads and
CTranslate2 against our search under its stopping rule (k finished); "x baseline" as "x native" above, against the
row named.

With ``ckpt=random`` (the default) a random tiny model is built with tests/tiny_checkpoint.py (speed only: its
output is noise). Torch runs on one thread, except in rows that name more. In the search table sentences are
batched by tokens as ``translate`` does and every batch is decoded by each row in turn (the order rotates from
batch to batch; ``rounds`` passes over the batches). A pause of 0.2 s before each timed call lets the threads
of the row before go idle.
Load averages are printed before and after: on a machine that other jobs share, the ratios of rows measured
side by side hold better than the seconds. ``ctranslate2=false`` leaves the CTranslate2 rows out.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from baselines import (  # benchmarks/: the searches as they were
    before_beam,
    before_greedy,
    previous_beam,
    previous_greedy,
)
from torch import Tensor

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.search import beam_search, greedy_decode
from transformer_nmt.inference.batches import token_batches
from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
from transformer_nmt.inference.evaluate import score
from transformer_nmt.inference.export import export_model, import_ctranslate2
from transformer_nmt.inference.translate import encode_sources, read_lines, translate_lines
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import provenance_line

ROOT = Path(__file__).resolve().parent.parent
DECODE = DecodeConfig()  # the defaults of translate's search
OPTIONS = {"ckpt": "random", "src": None, "ref": None, "max_tokens": DECODE.max_tokens, "limit": 1000,
           "beam": DECODE.beam, "rounds": 1,
           "threads": [2, 1], "ctranslate2": True, "tables": ["serving", "search"]}
TABLES = ("serving", "search")
PAUSE_SECONDS = 0.2


# --- engines: name -> (baseline name or None, function lines -> translations) --------------------------------
Engine = Callable[[list[str]], list[str]]


def ours(model: Transformer, tokenizer: Tokenizer, search: Callable[[Tensor], list[list[int]]]) -> Engine:
    """Lines -> translations with ``search(src (B, S)) -> ids per sentence`` over one padded batch."""
    def translate(lines: list[str]) -> list[str]:
        sources = encode_sources(tokenizer, lines, model.config.max_positions)
        src = torch.full((len(lines), max(map(len, sources))), model.config.pad_id, dtype=torch.long)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        return [tokenizer.decode(ids) for ids in search(src)]
    return translate


def with_threads(threads: int, engine: Engine) -> Engine:
    """Run ``engine`` with torch on ``threads`` threads, then go back to the number before."""
    def translate(lines: list[str]) -> list[str]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        assert torch.get_num_threads() == threads
        try:
            return engine(lines)
        finally:
            torch.set_num_threads(before)
    return translate


def report_ctranslate2_backend(model_dir: Path) -> None:
    """CTranslate2's own account of its CPU dispatch (ISA, whether it uses MKL, its GEMM backends), which it logs to
    stderr once, when its first model loads: loaded here at INFO. Its choices follow CT2_FORCE_CPU_ISA and
    CT2_USE_MKL (the provenance line records both where set)."""
    ctranslate2 = import_ctranslate2()
    ctranslate2.set_log_level(logging.INFO)
    CTranslate2Model(model_dir, threads=1)
    ctranslate2.set_log_level(logging.WARNING)


def ctranslate2_engines(model: Transformer, tokenizer: Tokenizer, k: int, baseline: str,
                        threads: list[int]) -> dict[str, tuple[str | None, Engine]]:
    """``model`` exported as float32 and as int8 (to a temporary directory), each loaded with each number of threads."""
    import_ctranslate2()
    directory = Path(tempfile.mkdtemp(prefix="ct2_benchmark_"))
    rows = {}
    for quantization, label in (("none", "float32"), ("int8", "int8")):
        model_dir = export_model(model, tokenizer, directory / quantization, quantization)
        if quantization == "none":
            report_ctranslate2_backend(model_dir)
        for n in threads:
            translator = CTranslate2Model(model_dir, threads=n)
            rows[f"ctranslate2 {label}, beam {k}, {n} thread{'s' if n > 1 else ''}"] = (
                baseline, lambda lines, translator=translator: [
                    hyps[0][0] for hyps in translate_lines(translator, tokenizer, lines, beam=k)])
    return rows


def engines(model: Transformer, tokenizer: Tokenizer, k: int, threads: list[int],
            ctranslate2: bool) -> dict[str, tuple[str | None, Engine]]:
    bos, eos = tokenizer.bos_id, tokenizer.eos_id

    def beam(stop):
        return ours(model, tokenizer, lambda src: [hyps[0].tokens for hyps in beam_search(
            model, src, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, beam_size=k, alpha=DECODE.alpha,
            max_len_offset=DECODE.max_len_offset, stop=stop)])
    before, same_rule = f"beam {k}, before", f"beam {k}, after, stop=k_finished"
    default = f"beam {k}, after, stop=bound (default)"
    rows = {
        "greedy, before": (None, ours(model, tokenizer, lambda src: before_greedy(
            model, src, bos, eos, DECODE.max_len_offset))),
        "greedy, after": ("greedy, before", ours(model, tokenizer, lambda src: greedy_decode(
            model, src, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, max_len_offset=DECODE.max_len_offset))),
        before: (None, ours(model, tokenizer, lambda src: before_beam(
            model, src, k, bos, eos, DECODE.alpha, DECODE.max_len_offset))),
        same_rule: (before, beam("k_finished")),
        default: (before, beam("bound")),
        # Issue 31 routed the searches through decoding.next_log_probs (ensembles, prefixes, log-probabilities):
        # the searches as they were just before, against today's ("x baseline" > 1: the old one was faster).
        "greedy, before issue 31": ("greedy, after", ours(model, tokenizer, lambda src: previous_greedy(
            model, src, max_len_offset=DECODE.max_len_offset))),
        f"beam {k}, before issue 31, stop=bound": (default, ours(model, tokenizer, lambda src: [
            hyps[0][0] for hyps in previous_beam(model, src, k, DECODE.alpha, DECODE.max_len_offset)])),
    }
    for n in threads:
        if n != 1:
            rows[f"{default}, {n} threads"] = (default, with_threads(n, beam("bound")))
    if ctranslate2:
        rows.update(ctranslate2_engines(model, tokenizer, k, same_rule, threads))
    return rows


def serving_engines(model: Transformer, tokenizer: Tokenizer, k: int, threads: list[int], ctranslate2: bool
                    ) -> dict[str, tuple[str, str | None, Engine]]:
    """The serving table's rows: name -> (search, native row of the same search and threads, lines -> translations).
    Native rows run ``translate_lines`` with the checkpoint's model on n torch threads; CTranslate2 rows with the
    model exported as float32 (``compute_type`` as exported, and ``int8`` quantized at load, as
    ``engine=ctranslate2 compute_type=int8`` does)."""
    model_dir = None
    if ctranslate2:
        import_ctranslate2()
        model_dir = export_model(model, tokenizer, Path(tempfile.mkdtemp(prefix="ct2_benchmark_")) / "float32")
        report_ctranslate2_backend(model_dir)
    rows = {}
    for beam, search in ((k, f"beam {k}"), (1, "greedy")):
        for n in threads:
            native = f"{search}, native, {n} thread{'s' if n > 1 else ''}"
            rows[native] = (search, None, with_threads(n, lambda lines, beam=beam: [
                hyps[0][0] for hyps in translate_lines(model, tokenizer, lines, beam=beam)]))
            if not ctranslate2:
                continue
            layouts = [(n, 1)] + ([(1, n)] if n > 1 else [])  # (intra_threads, inter_threads)
            for compute_type in ("default", "int8"):
                for intra, inter in layouts:
                    translator = CTranslate2Model(model_dir, compute_type=compute_type, threads=intra,
                                                  inter_threads=inter)
                    label = "float32" if compute_type == "default" else compute_type
                    layout = f"{intra} thread{'s' if intra > 1 else ''}" + (f" x inter_threads {inter}" if inter > 1
                                                                            else "")
                    rows[f"{search}, ctranslate2 {label}, {layout}"] = (
                        search, native, lambda lines, beam=beam, translator=translator: [
                            hyps[0][0] for hyps in translate_lines(translator, tokenizer, lines, beam=beam)])
    return rows


def thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) each thread of this process has run, by thread id (Linux /proc)."""
    ticks, times = os.sysconf("SC_CLK_TCK"), {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        times[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return times


def run_rows(rows: dict[str, Engine], sources: list[str], batches: list[list[int]], rounds: int
             ) -> tuple[dict[str, list[float]], dict[str, list[str]], dict[str, list[int]]]:
    """Each batch through every row, the order rotating: (seconds per batch, outputs, busy threads per batch),
    batches repeated ``rounds`` times."""
    names = list(rows)
    seconds = {name: [] for name in names}
    busy = {name: [] for name in names}
    outputs = {name: [""] * len(sources) for name in names}
    for n, batch in enumerate(batches * rounds):
        lines = [sources[i] for i in batch]
        for name in names[n % len(names):] + names[: n % len(names)]:  # rotate the order
            time.sleep(PAUSE_SECONDS)  # the threads of the row before stop spinning
            cpu = thread_cpu_seconds()
            started = time.perf_counter()
            translations = rows[name](lines)
            wall = time.perf_counter() - started
            after = thread_cpu_seconds()
            seconds[name].append(wall)
            busy[name].append(sum(t - cpu.get(tid, 0.0) >= 0.25 * wall for tid, t in after.items()))
            for i, text in zip(batch, translations):
                outputs[name][i] = text
        print(f"batch {n + 1}/{len(batches) * rounds} ({len(batch)} sentences)", file=sys.stderr)
    return seconds, outputs, busy


def median_speedup(seconds: dict[str, list[float]], name: str, baseline: str) -> str:
    return f"{statistics.median(b / a for a, b in zip(seconds[name], seconds[baseline])):.2f}x"


def model_and_tokenizer(ckpt: str) -> tuple[Transformer, Tokenizer, dict]:
    if ckpt:
        return load_checkpoint(ckpt, map_location="cpu")
    print("no ckpt=: a random tiny model (tests/tiny_checkpoint.py); its translations are noise\n")
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_checkpoint import tiny_tokenizer, write_checkpoint
    path = Path(tempfile.mkdtemp()) / "tiny.ckpt"
    write_checkpoint(path, tiny_tokenizer(), max_positions=128)
    return load_checkpoint(path, map_location="cpu")


def main(argv: list[str]) -> None:
    options = parse_options(argv, OPTIONS)
    tables = list(options["tables"])
    if not tables or any(t not in TABLES for t in tables):
        raise SystemExit(f"tables={tables}: a list of {' and '.join(TABLES)}")
    torch.set_num_threads(1)
    print(provenance_line({"options": dict(options)}))
    model, tokenizer, meta = model_and_tokenizer(options["ckpt"] if options["ckpt"] != "random" else "")
    model.eval()
    data = meta.get("data_config") or {}
    src_lang, tgt_lang = data.get("src_lang", "en"), data.get("tgt_lang", "de")
    test = ROOT / "data" / "multi30k" / "test_2016_flickr"
    sources = read_lines(options["src"] or f"{test}.{src_lang}.gz")[: options["limit"]]
    references = read_lines(options["ref"] or f"{test}.{tgt_lang}.gz")[: options["limit"]]
    lengths = [len(ids) for ids in encode_sources(tokenizer, sources, model.config.max_positions)]
    batches = token_batches(lengths, options["max_tokens"])
    rounds, threads = options["rounds"], list(options["threads"])

    versions = f"torch {torch.__version__}"
    if options["ctranslate2"]:
        versions += f", ctranslate2 {import_ctranslate2().__version__}"
    header = (f"{len(sources)} sentences in batches of <= {options['max_tokens']} source tokens, "
              f"{versions}, {os.cpu_count()} CPUs, model d_model {model.config.d_model}, "
              f"{model.config.n_encoder_layers}+{model.config.n_decoder_layers} layers, {model.config.n_heads} heads, "
              f"vocab {model.config.vocab_size}")

    def bleu(texts):
        return score(texts, references)["bleu"]

    if "serving" in tables:
        load = os.getloadavg()
        table = serving_engines(model, tokenizer, options["beam"], threads, options["ctranslate2"])
        seconds, outputs, busy = run_rows({name: row[2] for name, row in table.items()}, sources,
                                          [list(range(len(sources)))], rounds)  # whole passes, as evaluate
        print(f"\nserving, {rounds} round(s): {header}; load average {load[0]:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after\n")
        print("| search | engine | seconds | x native | same | busy threads | BLEU |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, (search, native, _) in table.items():
            speedup = median_speedup(seconds, name, native) if native else "-"
            same = f"{sum(a == b for a, b in zip(outputs[name], outputs[native]))}/{len(sources)}" if native else "-"
            print(f"| {search} | {name.removeprefix(search + ', ')} | {statistics.median(seconds[name]):.2f} | "
                  f"{speedup} | {same} | {statistics.median(busy[name]):g} | {bleu(outputs[name]):.2f} |")

    if "search" in tables:
        load = os.getloadavg()
        table = engines(model, tokenizer, options["beam"], threads, options["ctranslate2"])
        seconds, outputs, _ = run_rows({name: row[1] for name, row in table.items()}, sources, batches, rounds)
        print(f"\nsearch, {rounds} x {len(batches)} batches: {header}; load average {load[0]:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after\n")
        print("| engine | sentences/s | target tokens/s | baseline | x baseline | same | BLEU | length ratio | BP |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, (baseline, _) in table.items():
            total = sum(seconds[name]) / rounds  # seconds per pass
            tokens = sum(len(ids) for ids in tokenizer.encode_batch(outputs[name]))
            speedup = same = "-"
            if baseline:
                speedup = median_speedup(seconds, name, baseline)
                same = f"{sum(a == b for a, b in zip(outputs[name], outputs[baseline]))}/{len(sources)}"
            metrics = score(outputs[name], references)
            print(f"| {name} | {len(sources) / total:.1f} | {tokens / total:,.0f} | {baseline or '-'} | {speedup} | "
                  f"{same} | {metrics['bleu']:.2f} | {metrics['length_ratio']:.3f} | {metrics['bp']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
