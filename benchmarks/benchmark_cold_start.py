"""Cold start of ``translate``: what one sentence costs beyond importing torch, in fresh processes.

    python benchmarks/benchmark_cold_start.py --runs 5 --json docs/benchmarks/cold_start.json
    python benchmarks/benchmark_cold_start.py --before /tmp/old/src   # also a checkout's src/, e.g. an older commit

Writes a tiny checkpoint (a random 1+1-layer model, a SentencePiece model trained on Multi30k's first lines) to a
temporary directory, then alternates ``--runs`` times between ``python -c "import torch"`` and
``echo "A man is riding a bike." | python -m transformer_nmt.translate ckpt=CKPT`` (and, with ``--before``, the same
translate with PYTHONPATH at that src/, each after its own import-torch run), so that a load on the machine
touches both alike. Prints the median seconds of each and the median of the per-pair differences (translate -
the torch import just before it), with the CPU flags; ``--json`` writes the raw timings. The budget: translate
at most 0.5 s more than importing torch. Each translate runs in an empty directory, which must stay empty, and
its stdout must be the one translation line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer_nmt.checkpoint import CKPT_MODEL_CONFIG, CKPT_TOKENIZER, atomic_torch_save
from transformer_nmt.data.tokenizer import train_sentencepiece
from transformer_nmt.hardware import isa_variables, reported_cpu_flags
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.provenance import collect as collect_provenance

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = "A man is riding a bike."
BUDGET_SECONDS = 0.5  # translate may cost this much more than importing torch (issue 53; 1 s before)
# What caps the kernels' instruction set (docs/benchmarks/fp32_isa/: the AVX2 code path on a host with more): the
# children inherit them; the raw file records them.


def tiny_checkpoint(path: Path) -> Path:
    """A loadable checkpoint of a random small model with a 200-piece tokenizer, written with package code."""
    lines = []
    for lang in ("en", "de"):
        with gzip.open(ROOT / "data" / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines += [next(f).rstrip("\n") for _ in range(300)]
    tokenizer = train_sentencepiece(iter(lines), vocab_size=200)
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
                               n_decoder_layers=1, d_ff=32, dropout=0.0, max_positions=64)
    model = Transformer(config)
    atomic_torch_save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                       CKPT_MODEL_CONFIG: config.to_dict(), CKPT_TOKENIZER: tokenizer.model_proto,
                       "global_step": 1, "epoch": 0}, path)
    return path


def cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children: less moved by other load than wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], src: Path, stdin: str | None = None, threads: int | None = None
          ) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of ``command`` with PYTHONPATH at ``src`` (and OMP_NUM_THREADS at
    ``threads``, if given), run in a fresh empty directory."""
    with tempfile.TemporaryDirectory(prefix="cold_start_cwd_") as cwd:
        env = {**os.environ, "PYTHONPATH": str(src), **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
        started, cpu_started = time.perf_counter(), cpu_seconds()
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=cwd, env=env)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} (PYTHONPATH={src}) failed:\n{done.stderr}")
        if os.listdir(cwd):
            raise SystemExit(f"{' '.join(command)} wrote {os.listdir(cwd)} to its working directory")
    return seconds, cpu, done.stdout


def measure(ckpt: Path, variants: dict[str, Path], runs: int, threads: int | None = None
            ) -> dict[str, dict[str, list[float]]]:
    """{variant: {"torch": [s, ...], "translate": [s, ...], "torch_cpu": ..., "translate_cpu": ...}} (wall and
    CPU seconds), the runs interleaved: torch, translate of the first variant, torch, translate of the next, ...,
    ``runs`` rounds."""
    timings = {name: {"torch": [], "translate": [], "torch_cpu": [], "translate_cpu": []} for name in variants}
    translate = [sys.executable, "-m", "transformer_nmt.translate", f"ckpt={ckpt}"]
    for round_ in range(runs):
        for name, src in variants.items():
            torch_seconds, torch_cpu, _ = timed([sys.executable, "-c", "import torch"], src, threads=threads)
            seconds, cpu, out = timed(translate, src, SENTENCE + "\n", threads)
            if len(out.splitlines()) != 1:
                raise SystemExit(f"translate ({name}) printed {out!r}: stdout must hold the one translation only")
            timings[name]["torch"].append(round(torch_seconds, 4))
            timings[name]["translate"].append(round(seconds, 4))
            timings[name]["torch_cpu"].append(round(torch_cpu, 4))
            timings[name]["translate_cpu"].append(round(cpu, 4))
            print(f"round {round_ + 1}/{runs} {name}: import torch {torch_seconds:.2f} s, translate {seconds:.2f} s",
                  file=sys.stderr)
    return timings


def summary(timings: dict[str, list[float]]) -> dict[str, float]:
    """Medians of each list, and of the per-pair differences translate - torch (wall and CPU)."""
    medians = {key: statistics.median(values) for key, values in timings.items()}
    for suffix in ("", "_cpu"):
        pairs = zip(timings["translate" + suffix], timings["torch" + suffix])
        medians["difference" + suffix] = statistics.median(t - i for t, i in pairs)
    return medians


def table(timings: dict[str, dict[str, list[float]]], labels: dict[str, str]) -> str:
    lines = ["| code | import torch (median s) | translate 1 sentence (median s) "
             f"| translate - torch (median of pairs, s) | the same in CPU s | within {BUDGET_SECONDS:g} s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, runs in timings.items():
        s = summary(runs)
        lines.append(f"| {labels[name]} | {s['torch']:.2f} | {s['translate']:.2f} | {s['difference']:+.2f} | "
                     f"{s['difference_cpu']:+.2f} | {'yes' if s['difference'] <= BUDGET_SECONDS else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds of (import torch, translate) per code")
    parser.add_argument("--json", type=Path, help="write the raw timings here")
    parser.add_argument("--before", type=Path, help="also time a src/ directory of another checkout")
    parser.add_argument("--before-label", default="before", help="its name in the table")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every run (default: torch's own choice)")
    args = parser.parse_args(argv)
    provenance = collect_provenance({"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}})
    variants = {"after": ROOT / "src"}
    labels = {"after": "this checkout"}
    if args.before:
        if not (args.before / "transformer_nmt" / "translate.py").is_file():
            raise SystemExit(f"--before {args.before}: no transformer_nmt/translate.py there (give a checkout's src/)")
        variants["before"], labels["before"] = args.before.resolve(), args.before_label
    with tempfile.TemporaryDirectory(prefix="cold_start_") as tmp:
        ckpt = tiny_checkpoint(Path(tmp) / "tiny.ckpt")
        timings = measure(ckpt, variants, args.runs, args.threads)
    flags = reported_cpu_flags()
    print(table(timings, labels))
    capped = " ".join(f"{name}={value}" for name, value in isa_variables().items())
    print(f"\nCPU flags: {' '.join(flags) or 'none of those reported'}; {os.cpu_count()} CPUs; "
          f"torch {torch.__version__}" + (f"; {capped}" if capped else ""))
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "runs": args.runs, "sentence": SENTENCE,
              "omp_num_threads": args.threads, "load_average": os.getloadavg(),
              "isa_variables": isa_variables(),
              "cpu_flags": flags, "cpus": os.cpu_count(), "torch": torch.__version__,
              "codes": {name: {"label": labels[name], "src": str(src)} for name, src in variants.items()},
              "timings": timings, "medians": {name: summary(runs) for name, runs in timings.items()},
              "budget_seconds": BUDGET_SECONDS, "provenance": provenance}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
