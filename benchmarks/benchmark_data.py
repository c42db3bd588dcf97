"""Throughput and memory of the data pipeline on synthetic corpora.

    python benchmarks/benchmark_data.py                       # N = 100k and 1M pairs
    python benchmarks/benchmark_data.py --pairs 100000 --num-proc 2 --vocab-size 8000
    python benchmarks/benchmark_data.py --wmt --pairs 1000000 4500000 [--ddp]   # WMT scale, see wmt_scale()
    python benchmarks/benchmark_data.py --plans --pairs 4500000                 # the epoch plan alone

For each N, three phases each run in a fresh process so that its peak RSS is its own: reading the
text files into Arrow, training the SentencePiece vocabulary (on a sample of ``--input-sentence-size``
sentences), and tokenizing with ``datasets.map``. Prints pairs/s of wall-clock time, and per CPU-second
(on a shared machine; tokenization with --num-proc 2 on two free cores runs at about twice that figure);
peak RSS of the phase's process and of its largest worker (RSS includes the pages of memory-mapped Arrow
files that were read, which the kernel can drop); and the peak anonymous memory of the process and its
workers together, sampled from /proc: the memory that would grow with the corpus if anything did.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from transformer_nmt.provenance import provenance_line

ROOT = Path(__file__).resolve().parents[1]


def synthesize(n_pairs: int, folder: Path) -> str:
    """Write ``n_pairs`` pairs, Multi30k's training split repeated, as folder/train.{en,de}; return the prefix."""
    prefix = folder / f"synthetic{n_pairs}"
    for lang in ("en", "de"):
        with gzip.open(ROOT / "data" / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.readlines()
        with open(f"{prefix}.{lang}", "w", encoding="utf-8") as out:
            for start in range(0, n_pairs, len(lines)):
                out.writelines(lines[: min(len(lines), n_pairs - start)])
    return str(prefix)


def peak_rss_mb(who=resource.RUSAGE_SELF) -> float:
    """Peak resident set (includes pages of memory-mapped Arrow files, which the kernel can reclaim)."""
    return resource.getrusage(who).ru_maxrss / 1024  # Linux reports KiB


def anon_mb(pid: int | str = "self") -> float:
    """Anonymous (heap) resident memory of a process and its child processes, from /proc."""
    total = 0.0
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssAnon:"):
                total += int(line.split()[1]) / 1024
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += anon_mb(child)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


class AnonPeak(threading.Thread):
    """Samples ``anon_mb`` every 20 ms and keeps the peak: memory that really grows with the corpus."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running = 0.0, True

    def run(self):
        while self.running:
            self.peak = max(self.peak, anon_mb())
            time.sleep(0.02)


# ------------------------------------------------------------------------------------------------- WMT scale

WMT_STAGES = ("read", "vocabulary", "tokenize", "plan 25000", "plan 3125 x 8 ranks", "first batch")


def synthesize_wmt(n_pairs: int, folder: Path, seed: int = 0) -> str:
    """``n_pairs`` pairs with WMT14-like lengths: words drawn Zipf-like from Multi30k's vocabulary of each
    language, source lengths log-normal (median 21 words, mean about 24, a long tail to 250), target length
    the source's times N(1.05, 0.15). Written as folder/wmtN.{en,de}; returns the prefix."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = {}
    for lang in ("en", "de"):
        with gzip.open(ROOT / "data" / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            counts = {}
            for line in f:
                for word in line.split():
                    counts[word] = counts.get(word, 0) + 1
        words = sorted(counts, key=counts.get, reverse=True)
        table = np.array([w.encode() + b" " for w in words] + [b"\n"], dtype=object)  # last: end of line
        cdf = np.cumsum(1.0 / np.arange(1, len(words) + 1) ** 1.05)
        vocab[lang] = (table, cdf / cdf[-1])
    prefix = folder / f"wmt{n_pairs}"
    files = {lang: open(f"{prefix}.{lang}", "wb") for lang in vocab}
    for start in range(0, n_pairs, 100_000):
        n = min(100_000, n_pairs - start)
        src_len = np.clip(rng.lognormal(np.log(21), 0.55, n), 1, 250).astype(np.int64)
        lengths = {"en": src_len, "de": np.clip(src_len * rng.normal(1.05, 0.15, n), 1, 250).astype(np.int64)}
        for lang, (table, cdf) in vocab.items():
            ids = np.searchsorted(cdf, rng.random(int(lengths[lang].sum())))  # (words,)
            ends = np.cumsum(lengths[lang])
            ids = np.insert(ids, ends, len(table) - 1)  # an end-of-line after each sentence
            files[lang].write(b"".join(table[ids].tolist()).replace(b" \n", b"\n"))
    for f in files.values():
        f.close()
    return str(prefix)


def wmt_datamodule(args):
    from transformer_nmt.data.config import DataConfig
    from transformer_nmt.data.datamodule import TranslationDataModule

    prefix = args.prefix
    return TranslationDataModule(DataConfig(train=prefix, val=prefix + "-val", test=None, cache_dir=args.cache,
                                            vocab_size=args.vocab_size, input_sentence_size=args.input_sentence_size,
                                            character_coverage=0.9999, max_tokens=25000, max_positions=1024,
                                            max_length_ratio=1.5, num_proc=args.num_proc))


def run_wmt_stage(args) -> dict:
    """One stage of ``prepare`` (or of the first epoch), in this process, on the cache the earlier stages left."""
    import datasets

    from transformer_nmt.data.batching import TokenBucketBatchSampler

    datasets.disable_progress_bars()
    dm = wmt_datamodule(args)
    anon = AnonPeak()
    anon.start()
    start, cpu_start = time.perf_counter(), time.process_time()
    if args.stage in ("read", "vocabulary", "tokenize"):
        raw = {split: dm._raw_split(split) for split in ("train", "val")}
        if args.stage != "read":
            dm.tokenizer = dm._tokenizer(raw["train"])
        if args.stage == "tokenize":
            start, cpu_start = time.perf_counter(), time.process_time()  # not the vocabulary's loading
            for split in raw:
                dm._tokenized_split(split, *raw[split])
        extra = {}
    else:
        dm.setup()
        start, cpu_start = time.perf_counter(), time.process_time()
        if args.stage == "first batch":
            batch = next(iter(dm.train_dataloader()))
            extra = {"batch": list(batch["src"].shape)}
        else:
            max_tokens, ranks = (25000, 1) if args.stage == "plan 25000" else (3125, 8)
            sampler = TokenBucketBatchSampler(dm.splits["train"].widths, max_tokens, seed=1, num_replicas=ranks)
            extra = {"batches per rank": len(sampler)}  # plans epoch 0: all ranks' batches, keeps rank 0's
    seconds = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # tokenization's workers, once joined
    cpu = time.process_time() - cpu_start + children.ru_utime + children.ru_stime
    anon.running = False
    anon.join()
    return {"stage": args.stage, "pairs": args.n, "seconds": seconds, "cpu_seconds": cpu, "rss_mb": peak_rss_mb(),
            "worker_rss_mb": peak_rss_mb(resource.RUSAGE_CHILDREN), "anon_mb": anon.peak, **extra}


def du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20 if path.exists() else 0.0


def process_tree_memory(pid: int, peaks: dict) -> None:
    """Record each process's peak RSS (VmHWM) and anonymous RSS under ``pid``, keyed by (pid, LOCAL_RANK)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"LOCAL_RANK=")), "0")
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        hwm, anon = (int(status[k].split()[0]) / 1024 for k in ("VmHWM", "RssAnon"))
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"transformer_nmt.train" in cmdline:
            old = peaks.get(pid, {"rank": rank, "hwm": 0, "anon": 0})
            peaks[pid] = {"rank": rank, "hwm": max(old["hwm"], hwm), "anon": max(old["anon"], anon)}
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                process_tree_memory(int(child), peaks)
    except (FileNotFoundError, ProcessLookupError, StopIteration, KeyError, ValueError):
        pass


def train_start(args, prefix: str, cache: str, work: str, devices: int) -> dict:
    """``python -m transformer_nmt.train`` on a warm cache, tiny model, one optimizer step; wall time of the
    whole command and each training process's peak RSS (rank from LOCAL_RANK). Batches of 1,000 tokens: at
    25,000 the tiny model's logits alone (25,000 x 37,000 floats) would take gigabytes and hide the data's share."""
    run_dir = Path(tempfile.mkdtemp(dir=work))
    cmd = [sys.executable, "-m", "transformer_nmt.train", "model=tiny", "model.max_positions=1024", "data=local",
           f"data.train={prefix}", f"data.val={prefix}-val", "data.test=null", f"data.cache_dir={cache}",
           f"data.vocab_size={args.vocab_size}", f"data.input_sentence_size={args.input_sentence_size}",
           "data.character_coverage=0.9999", "data.max_tokens=1000", "data.max_positions=1024",
           "data.max_length_ratio=1.5", f"data.num_proc={args.num_proc}", "trainer=cpu", "trainer.max_steps=1",
           "trainer.limit_val_batches=0", "trainer.enable_progress_bar=false", "run_test=false",
           "train.val_bleu_max_sentences=0", "attention_maps.every_n_validations=0", f"hydra.run.dir={run_dir}"]
    if devices > 1:
        cmd += [f"trainer.devices={devices}", "trainer.strategy=ddp"]
    start = time.perf_counter()
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks = {}
    while process.poll() is None:
        process_tree_memory(process.pid, peaks)
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    output = process.stdout.read()
    if process.returncode:
        sys.exit(f"train failed:\n{output[-3000:]}")
    ranks = sorted(peaks.values(), key=lambda p: p["rank"])
    return {"seconds": seconds, "ranks": ranks}


def plans_only(args) -> None:
    """The epoch plan alone on token lengths drawn as a WMT-like corpus would give them (median 27 tokens,
    log-normal; target the source's times N(1.05, 0.15)): three epochs at each setting, wall and CPU time."""
    import numpy as np

    from transformer_nmt.data.batching import TokenBucketBatchSampler, pair_widths

    rng = np.random.default_rng(0)
    for n in args.pairs:
        src = np.clip(rng.lognormal(np.log(27), 0.55, n), 1, 1023).astype(np.int32)
        widths = pair_widths(src, np.clip(src * rng.normal(1.05, 0.15, n), 1, 1022).astype(np.int32))
        for max_tokens, ranks in ((25000, 1), (3125, 8)):
            for epoch in range(3):
                sampler = TokenBucketBatchSampler(widths, max_tokens, seed=1, num_replicas=ranks)
                sampler.set_epoch(epoch)
                start, cpu = time.perf_counter(), time.process_time()
                batches = len(sampler)
                print(f"plan {n:>9,} pairs, {max_tokens:>6,} tokens x {ranks} ranks, epoch {epoch}: "
                      f"{batches:,} batches per rank, {time.perf_counter() - start:.2f} s "
                      f"({time.process_time() - cpu:.2f} CPU-s)", flush=True)


def wmt_scale(args) -> None:
    """Each stage in a fresh process, first on an empty cache (cold), then again on the cache it left (warm).
    Then the warm start of ``train`` to its first optimizer step; with --ddp, the same with 2 gloo processes."""
    rows, starts = [], []
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        for n in args.pairs:
            started = time.perf_counter()
            prefix = synthesize_wmt(n, Path(work))
            val = synthesize_wmt(3000, Path(work), seed=1)
            for lang in ("en", "de"):
                os.replace(f"{val}.{lang}", f"{prefix}-val.{lang}")
            print(f"synthesized {n:,} pairs in {time.perf_counter() - started:.0f} s "
                  f"({os.path.getsize(prefix + '.en') / 2**20:.0f} + {os.path.getsize(prefix + '.de') / 2**20:.0f} MB)",
                  flush=True)
            cache = Path(work) / f"cache{n}"
            for warmth in ("cold", "warm"):
                for stage in WMT_STAGES:
                    cmd = [sys.executable, __file__, "--stage", stage, "--n", str(n), "--prefix", prefix, "--cache",
                           str(cache), "--vocab-size", str(args.vocab_size), "--num-proc", str(args.num_proc),
                           "--input-sentence-size", str(args.input_sentence_size)]
                    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    if result.returncode:
                        sys.exit(f"{stage} at {n} pairs failed:\n{result.stderr[-3000:]}")
                    row = {**json.loads(result.stdout.strip().splitlines()[-1]), "warmth": warmth,
                           "cache_mb": du_mb(cache)}
                    rows.append(row)
                    print(f"{warmth:4} {stage:20} {n:>9,} pairs {row['seconds']:7.2f} s "
                          f"({row['cpu_seconds']:7.2f} CPU-s)  "
                          f"peak RSS {row['rss_mb']:6.0f} MB"
                          f"  workers {row['worker_rss_mb']:5.0f} MB  anon {row['anon_mb']:6.0f} MB  "
                          f"cache {row['cache_mb']:6.0f} MB  {row.get('batches per rank', row.get('batch', ''))}",
                          flush=True)
            for devices in (1, 2) if args.ddp and n == min(args.pairs) else (1,):
                start = train_start(args, prefix, str(cache), work, devices)
                starts.append({"pairs": n, "devices": devices, **start})
                print(f"train, warm cache, {devices} process(es): {start['seconds']:.1f} s to the end of step 1; "
                      + ", ".join(f"rank {r['rank']} peak RSS {r['hwm']:.0f} MB (anon {r['anon']:.0f} MB)"
                                  for r in start["ranks"]), flush=True)
            shutil.rmtree(cache)
            for path in Path(work).glob(f"wmt{n}*"):
                path.unlink()

    print("\n| stage | pairs | cache | seconds | CPU-seconds | peak RSS (MB) | worker peak RSS (MB) | peak anon. (MB) "
          "| cache on disk (MB) |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['stage']} | {r['pairs']:,} | {r['warmth']} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | "
              f"{r['rss_mb']:.0f} | "
              f"{r['worker_rss_mb']:.0f} | {r['anon_mb']:.0f} | {r['cache_mb']:.0f} |")
    for s in starts:
        print(f"| train to step 1, {s['devices']} process(es) | {s['pairs']:,} | warm | {s['seconds']:.1f} | - | "
              + " / ".join(f"{r['hwm']:.0f}" for r in s["ranks"]) + " | - | "
              + " / ".join(f"{r['anon']:.0f}" for r in s["ranks"]) + " | - |")
    by = {(r["stage"], r["pairs"], r["warmth"]): r for r in rows}
    for n in args.pairs:
        cold = sum(by[(stage, n, "cold")]["seconds"] for stage in ("read", "vocabulary", "tokenize"))
        print(f"cold prepare of {n:,} pairs (read + vocabulary + tokenize): {cold:.0f} s")
    if len(args.pairs) >= 2:
        small, large = min(args.pairs), max(args.pairs)
        for stage in WMT_STAGES:
            a, b = by[(stage, small, "cold")], by[(stage, large, "cold")]
            print(f"{stage}: peak RSS at {large:,} = {b['rss_mb'] / a['rss_mb']:.2f}x that at {small:,}")


# ------------------------------------------------------------------------------------------------- phases


def run_phase(args) -> dict:
    """One phase, in this process; returns its timing and peak memory."""
    import datasets

    from transformer_nmt.data.corpus import CorpusSpec, both_sides, write_split
    from transformer_nmt.data.tokenizer import Tokenizer, tokenize_dataset, train_sentencepiece

    datasets.disable_progress_bars()
    work = Path(args.workdir)
    raw_file, model_file = work / f"raw{args.n}.arrow", work / f"spm{args.n}.model"
    anon = AnonPeak()
    anon.start()
    start, cpu_start = time.perf_counter(), time.process_time()
    if args.phase == "read":
        spec = CorpusSpec("text", ("en", "de"), {"train": args.prefix})
        write_split(spec, "train", raw_file)
    elif args.phase == "vocab":
        raw = datasets.Dataset.from_file(str(raw_file))
        tokenizer = train_sentencepiece(both_sides(raw, ("de", "en")), vocab_size=args.vocab_size,
                                        input_sentence_size=args.input_sentence_size, num_threads=args.num_proc)
        tokenizer.save(model_file)
    else:
        raw = datasets.Dataset.from_file(str(raw_file))
        out = Path(tempfile.mkdtemp(dir=work))
        tokenize_dataset(raw, Tokenizer.load(model_file), ("en", "de"), out / "tokens.arrow", num_proc=args.num_proc)
    seconds = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu_start + children.ru_utime + children.ru_stime
    anon.running = False
    anon.join()
    return {"anon_mb": anon.peak, "cpu_seconds": cpu, "pairs_per_cpu_s": args.n / cpu, "phase": args.phase,
            "pairs": args.n, "seconds": seconds, "pairs_per_s": args.n / seconds,
            "rss_mb": peak_rss_mb(), "worker_rss_mb": peak_rss_mb(resource.RUSAGE_CHILDREN)}


def workers(row: dict) -> str:
    """Largest worker's peak RSS; only tokenization starts workers (other children are import-time helpers)."""
    return f"{row['worker_rss_mb']:.0f}" if row["phase"] == "tokenize" else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--vocab-size", type=int, default=None, help="default 8000; --wmt: 37000")
    parser.add_argument("--input-sentence-size", type=int, default=None,
                        help="sentences sampled for vocabulary training (both sides together); default 200,000; "
                             "--wmt: 2,000,000")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="where the synthetic corpora go (default: a temp dir)")
    parser.add_argument("--wmt", action="store_true", help="WMT scale: synthetic WMT-like corpora, the paper's data "
                        "settings (37k vocabulary, 25,000 tokens), stage by stage, cold and warm cache")
    parser.add_argument("--plans", action="store_true", help="only the epoch plan, on WMT-like token lengths")
    parser.add_argument("--ddp", action="store_true", help="with --wmt: also a 2-process gloo run at the smallest "
                        "size, RSS per rank")
    parser.add_argument("--phase", choices=["read", "vocab", "tokenize"], help=argparse.SUPPRESS)
    parser.add_argument("--stage", choices=WMT_STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.vocab_size = args.vocab_size or (37000 if args.wmt else 8000)
    args.input_sentence_size = args.input_sentence_size or (2_000_000 if args.wmt else 200_000)
    if args.phase:  # a child process: run one phase, report as JSON
        print(json.dumps(run_phase(args)))
        return
    if args.stage:
        print(json.dumps(run_wmt_stage(args)))
        return
    print(provenance_line({"args": vars(args)}))
    if args.plans:
        plans_only(args)
        return
    if args.wmt:
        wmt_scale(args)
        return

    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        rows = []
        for n in args.pairs:
            prefix = synthesize(n, Path(work))
            for phase in ("read", "vocab", "tokenize"):
                cmd = [sys.executable, __file__, "--phase", phase, "--n", str(n), "--prefix", prefix, "--workdir",
                       work, "--vocab-size", str(args.vocab_size), "--num-proc", str(args.num_proc),
                       "--input-sentence-size", str(args.input_sentence_size)]
                result = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if result.returncode:
                    sys.exit(f"{phase} at {n} pairs failed:\n{result.stderr[-3000:]}")
                rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(f"{phase:9} {n:>9,} pairs  {r['seconds']:7.1f} s  {r['pairs_per_s']:>10,.0f} pairs/s "
                      f"({r['pairs_per_cpu_s']:>9,.0f} per CPU-s)  "
                      f"peak RSS {r['rss_mb']:5.0f} MB (workers {workers(r):>4} MB), "
                      f"peak anonymous memory {r['anon_mb']:5.0f} MB", flush=True)

    print("\n| phase | pairs | seconds | pairs/s | pairs per CPU-second | peak RSS (MB) | worker peak RSS (MB) "
          "| peak anon. memory (MB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['phase']} | {r['pairs']:,} | {r['seconds']:.1f} | {r['pairs_per_s']:,.0f} "
              f"| {r['pairs_per_cpu_s']:,.0f} | {r['rss_mb']:.0f} | {workers(r)} | {r['anon_mb']:.0f} |")
    by = {(r["phase"], r["pairs"]): r for r in rows}
    if len(args.pairs) >= 2:
        small, large = min(args.pairs), max(args.pairs)

        def rss(r):
            return max(r["rss_mb"], r["worker_rss_mb"] if r["phase"] == "tokenize" else 0)

        for phase in ("read", "vocab", "tokenize"):
            a, b = by[(phase, small)], by[(phase, large)]
            ratio = rss(b) / rss(a)
            anon = b["anon_mb"] / a["anon_mb"]
            print(f"{phase}: peak RSS at {large:,} pairs = {ratio:.2f}x that at {small:,}; "
                  f"anonymous memory {anon:.2f}x")


if __name__ == "__main__":
    main()
