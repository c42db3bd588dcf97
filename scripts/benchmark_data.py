"""Throughput and memory of the data pipeline on a synthetic corpus made by replicating Multi30k.

    python scripts/benchmark_data.py                       # N = 100k and 1M pairs
    python scripts/benchmark_data.py --pairs 100000 --num-proc 2 --vocab-size 8000

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
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def run_phase(args) -> dict:
    """One phase, in this process; returns its timing and peak memory."""
    import datasets

    from transformer_nmt.corpus import CorpusSpec, both_sides, write_split
    from transformer_nmt.tokenizer import Tokenizer, tokenize_dataset, train_sentencepiece

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
    return {"anon_mb": anon.peak, "cpu_seconds": cpu, "pairs_per_cpu_s": args.n / cpu, "phase": args.phase, "pairs": args.n, "seconds": seconds, "pairs_per_s": args.n / seconds,
            "rss_mb": peak_rss_mb(), "worker_rss_mb": peak_rss_mb(resource.RUSAGE_CHILDREN)}


def workers(row: dict) -> str:
    """Largest worker's peak RSS; only tokenization starts workers (other children are import-time helpers)."""
    return f"{row['worker_rss_mb']:.0f}" if row["phase"] == "tokenize" else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--input-sentence-size", type=int, default=200_000,
                        help="sentences sampled for vocabulary training (both sides together)")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="where the synthetic corpora go (default: a temp dir)")
    parser.add_argument("--phase", choices=["read", "vocab", "tokenize"], help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:  # a child process: run one phase, report as JSON
        print(json.dumps(run_phase(args)))
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

    print("\n| phase | pairs | seconds | pairs/s | pairs per CPU-second | peak RSS (MB) | worker peak RSS (MB) | peak anon. memory (MB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['phase']} | {r['pairs']:,} | {r['seconds']:.1f} | {r['pairs_per_s']:,.0f} | {r['pairs_per_cpu_s']:,.0f} | {r['rss_mb']:.0f} "
              f"| {workers(r)} | {r['anon_mb']:.0f} |")
    by = {(r["phase"], r["pairs"]): r for r in rows}
    if len(args.pairs) >= 2:
        small, large = min(args.pairs), max(args.pairs)
        for phase in ("read", "vocab", "tokenize"):
            a, b = by[(phase, small)], by[(phase, large)]
            rss = (lambda r: max(r["rss_mb"], r["worker_rss_mb"] if r["phase"] == "tokenize" else 0))
            ratio = rss(b) / rss(a)
            anon = b["anon_mb"] / a["anon_mb"]
            print(f"{phase}: peak RSS at {large:,} pairs = {ratio:.2f}x that at {small:,}; "
                  f"anonymous memory {anon:.2f}x")


if __name__ == "__main__":
    main()
