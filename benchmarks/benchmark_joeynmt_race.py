"""Training end to end against JoeyNMT: the recipe's shape on Multi30k en->de, the same SentencePiece model, the same
batch budget, target tokens per second over the same number of optimizer steps, alternating.

    python benchmarks/benchmark_joeynmt_race.py --joeynmt-python /path/to/joey-venv/bin/python
    python benchmarks/benchmark_joeynmt_race.py --joeynmt-python PY --steps 100 --rounds 3 --threads 2 --json race.json

JoeyNMT pins protobuf below 3.21, which this project's stack does not install beside it: give it a venv of its own
and name its Python. JoeyNMT 2.3.0 also imports importlib_metadata without requiring it, and calls SentencePiece's
``SetVocabulary``, which sentencepiece 0.2.3 no longer has:
``python -m venv joey && joey/bin/pip install torch==2.13.0 joeynmt==2.3.0 importlib_metadata sentencepiece==0.2.0``.

Both sides train the recipe's shape (conf/experiment/multi30k_cpu.yaml: 3+3 layers, d_model 256, 4 heads, d_ff
1024, shared and tied embeddings, Adam (0.9, 0.98), label smoothing 0.1) with the values the recipe gives
``--precision`` (default fp32: JoeyNMT has no CPU autocast; the recipe's fp32 batch is 1,024 tokens a side, its
dropout 0.1, its warm-up and peak), on the bundled Multi30k train
split tokenized by the SentencePiece model our datamodule trains for the recipe (JoeyNMT reads it as its
``tokenizer_cfg.model_file``, its vocabulary file the model's pieces). Batches: ours, ``data.max_tokens`` padded
tokens per side (length buckets); JoeyNMT's, ``batch_type: token`` (its sampler counts the longest side's length + 1
times the sentences, in random order: no buckets), its ``batch_size`` chosen so that its mean target tokens per step
equal ours (its sampler replayed on the same tokenized pairs; at our 4,096 its batches hold half our tokens: the
padding of unbucketed batches). What differs and stays: positions (ours rotary, the recipe's; JoeyNMT's
sinusoidal), each toolkit's own initialisation and data pipeline (JoeyNMT tokenizes each pair in its loop, twice a
step: its sampler's and its collate's reads; ours reads ids tokenized once); both sides' mean target tokens per step
printed. Dropout: ours takes JoeyNMT's placements (``same_dropouts``: on the attention weights and the feed-forward's
hidden units, which JoeyNMT cannot turn off), so that both draw the same masks.

Throughput: ``--rounds`` rounds of ``--steps`` optimizer steps each, ours then JoeyNMT's (alternating, so that a
drifting load hits both). Ours: results.json's target tokens per second (every step but the first, the time from
optimizer step to optimizer step: data included). JoeyNMT's: the same measure from its own training loop (the
window it logs as "Tokens per Sec", here one step wide; every step but the first), recorded by a wrapper of its
logging method (``JOEY_DRIVER``: the only thing added to ``python -m joeynmt train``). The table gives each side's
median and the median of the per-round ratios. Prints CPU flags, threads and load; ``--json`` writes the raw numbers
with the provenance (commit, versions, CPU, the instruction-set variables a run held to AVX2 sets).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from benchmark_hf_race import RACE_OVERRIDES, recipe  # noqa: E402  (benchmarks/: the recipe as the race reads it)

# Run by JoeyNMT's Python: python -m joeynmt train CONFIG --skip-test, with each logging window's target tokens and
# seconds (the numbers its "Tokens per Sec" divides) appended to a JSON-lines file.
JOEY_DRIVER = """
import json, runpy, sys
from joeynmt import training

config, record = sys.argv[1], sys.argv[2]
logged = training.TrainManager._log_scores

def log_scores(self, epoch_no, elapsed_time, start_tokens, start_correct, total_batch_loss):
    with open(record, "a") as out:
        out.write(json.dumps({"step": self.stats.steps, "tokens": self.stats.total_tokens - start_tokens,
                              "seconds": elapsed_time}) + "\\n")
    logged(self, epoch_no, elapsed_time, start_tokens, start_correct, total_batch_loss)

training.TrainManager._log_scores = log_scores
sys.argv = ["joeynmt", "train", config, "--skip-test"]
runpy.run_module("joeynmt", run_name="__main__")
"""


def plain_copy(source: Path, target: Path) -> Path:
    """``source`` (gzip or not) as a plain text file, as JoeyNMT's plain dataset reads it."""
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt", encoding="utf-8") as src, open(target, "w", encoding="utf-8") as out:
        out.write(src.read())
    return target


def joey_config(cfg, spm_model: Path, data: Path, work: Path, steps: int, threads: int) -> dict:
    """JoeyNMT's configuration of the recipe (a dict, written as the YAML JoeyNMT reads)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    specials = {"<unk>", "<pad>", "<s>", "</s>"}
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = work / "vocab.txt"
    vocab.write_text("".join(p + "\n" for p in pieces if p not in specials), encoding="utf-8")
    model, train = cfg.model, cfg.train
    if model.get("activation", "relu") != "relu" or model.get("norm", "layernorm") != "layernorm":
        raise SystemExit("the race writes JoeyNMT's relu feed-forward and LayerNorm: the recipe's model has "
                         f"activation={model.get('activation')}, norm={model.get('norm')}")
    lr_peak = train.lr_factor * model.d_model ** -0.5 * train.warmup_steps ** -0.5
    side = {"level": "bpe", "lowercase": False, "max_length": int(cfg.data.max_positions) - 1, "voc_file": str(vocab),
            "tokenizer_type": "sentencepiece", "tokenizer_cfg": {"model_file": str(spm_model)}}
    stack = {"type": "transformer", "num_layers": model.n_encoder_layers, "num_heads": model.n_heads,
             "embeddings": {"embedding_dim": model.d_model, "scale": True}, "hidden_size": model.d_model,
             "ff_size": model.d_ff, "dropout": model.dropout, "activation": "relu",
             "layer_norm": "pre" if model.get("norm_first", False) else "post"}
    return {
        "name": "race", "joeynmt_version": "2.3.0", "model_dir": str(work / "joey_run"), "use_cuda": False,
        "fp16": False, "random_seed": cfg.seed,
        "data": {"train": str(data / "train"), "dev": str(data / "val"), "dataset_type": "plain",
                 "src": {**side, "lang": cfg.data.src_lang}, "trg": {**side, "lang": cfg.data.tgt_lang},
                 "special_symbols": {"unk_token": "<unk>", "pad_token": "<pad>", "bos_token": "<s>",
                                     "eos_token": "</s>"}},
        "training": {"optimizer": "adam", "adam_betas": list(train.betas), "learning_rate": lr_peak,
                     "learning_rate_min": 1e-8, "scheduling": "warmupinversesquareroot",
                     "learning_rate_warmup": train.warmup_steps, "label_smoothing": train.label_smoothing,
                     "normalization": "tokens", "batch_size": int(cfg.data.max_tokens), "batch_type": "token",
                     "updates": steps, "epochs": 1000, "logging_freq": 1, "validation_freq": 10 ** 9,
                     "shuffle": True, "num_workers": 0, "keep_best_ckpts": 1, "overwrite": True,
                     "print_valid_sents": []},
        "model": {"initializer": "xavier_uniform", "embed_initializer": "xavier_uniform", "bias_initializer": "zeros",
                  "tied_embeddings": True, "tied_softmax": True, "encoder": stack,
                  "decoder": {**stack, "num_layers": model.n_decoder_layers}},
        "testing": {"beam_size": 1}, "threads": threads,
    }


def race_recipe(precision: str):
    """The recipe as ours trains it at ``precision`` (trainer.precision=PRECISION: the ${by_precision:} values, its
    batch, dropout and schedule, are that precision's, whatever this CPU's auto would pick): both sides' settings."""
    return recipe([*RACE_OVERRIDES, f"trainer.precision={precision}"])[0]


def joey_mean_target_tokens(order: list[int], src_lengths: list[int], tgt_lengths: list[int],
                             batch_size: int) -> float:
    """The mean target tokens (length + 1) of the batches JoeyNMT's TokenBatchSampler makes of the pairs in
    ``order``: a batch ends once max(len(src) + 1, len(trg) + 1) x its sentences reaches ``batch_size``; the last,
    shorter one is kept (its drop_last is off in training)."""
    sums, tokens, longest, count = [], 0, 0, 0
    for i in order:
        longest = max(longest, src_lengths[i] + 1, tgt_lengths[i] + 1)
        tokens, count = tokens + tgt_lengths[i] + 1, count + 1
        if longest * count >= batch_size:
            sums.append(tokens)
            tokens, longest, count = 0, 0, 0
    return statistics.mean(sums + ([tokens] if count else []))


def joey_batch_size(src_lengths: list[int], tgt_lengths: list[int], target: float, seed: int = 0) -> int:
    """JoeyNMT's token ``batch_size`` whose batches hold ``target`` target tokens on average over one random order
    of the pairs (its sampler replayed), within 8 of the smallest that does (bisection)."""
    import random

    order = list(range(len(src_lengths)))
    random.Random(seed).shuffle(order)
    low, high = 1, 1 << 20
    while high - low > 8:
        middle = (low + high) // 2
        if joey_mean_target_tokens(order, src_lengths, tgt_lengths, middle) < target:
            low = middle
        else:
            high = middle
    return high


def write_joey_config(config: dict, path: Path, steps: int) -> Path:
    """``config`` for ``steps`` updates as YAML (PyYAML writes 1.0e-08 where JSON's 1e-08 would read back as a
    string in JoeyNMT's YAML 1.1 loader)."""
    path.write_text(yaml.safe_dump({**{k: v for k, v in config.items() if k != "threads"},
                                    "training": {**config["training"], "updates": steps}}), encoding="utf-8")
    return path


def same_dropouts(cfg) -> list[str]:
    """Our overrides for JoeyNMT's dropout placements: it drops out the attention weights and the feed-forward's
    hidden units (after the activation) at the layers' dropout, with no option to turn either off; the recipe has
    neither (the paper's placements). Both sides then draw the same dropout masks' worth of work."""
    return [f"model.attention_dropout={cfg.model.dropout}", f"model.activation_dropout={cfg.model.dropout}"]


def train_ours(run_dir: Path, steps: int, threads: int, precision: str, overrides: list[str]) -> dict:
    """python -m transformer_nmt.train on the recipe (and ``overrides``) for ``steps`` updates: its results.json."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "transformer_nmt.train", *RACE_OVERRIDES, f"trainer.max_steps={steps}",
                    f"trainer.precision={precision}", *overrides, f"hydra.run.dir={run_dir}", "ckpt_path=null"],
                   check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    results = json.loads((run_dir / "results.json").read_text())
    results["process_seconds"] = time.perf_counter() - started
    return results


def train_joey(python: str, config: dict, work: Path, steps: int, threads: int) -> dict:
    """JoeyNMT's training for ``steps`` updates: target tokens per second over every step but the first."""
    config_file, record = write_joey_config(config, work / "joey.yaml", steps), work / "joey_steps.jsonl"
    record.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    done = subprocess.run([python, "-c", JOEY_DRIVER, str(config_file), str(record)], env=env, cwd=work,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"JoeyNMT failed (exit status {done.returncode}):\n{done.stderr[-3000:]}")
    windows = [json.loads(line) for line in record.read_text().splitlines()]
    if len(windows) != steps:
        raise SystemExit(f"JoeyNMT logged {len(windows)} steps of {steps}: it stopped early or ignored a setting "
                         f"({config_file}, {work / 'joey_run' / 'train.log'})")
    timed = windows[1:]
    return {"steps": len(windows), "train_tgt_tokens_per_sec": sum(w["tokens"] for w in timed)
            / sum(w["seconds"] for w in timed), "mean_target_tokens_per_step":
            statistics.mean(w["tokens"] for w in windows), "process_seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--joeynmt-python", default=os.environ.get("JOEYNMT_PYTHON"),
                        help="a Python with joeynmt installed (default: $JOEYNMT_PYTHON)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per side per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="32-true", help="our trainer.precision (JoeyNMT: fp32 on CPU)")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    args = parser.parse_args()
    if not args.joeynmt_python:
        raise SystemExit("give --joeynmt-python PATH (or JOEYNMT_PYTHON): a Python with joeynmt installed (module doc)")
    version = subprocess.run([args.joeynmt_python, "-c", "import joeynmt, torch; print(joeynmt.__version__, "
                              "torch.__version__)"], capture_output=True, text=True)
    if version.returncode != 0:
        raise SystemExit(f"{args.joeynmt_python} cannot import joeynmt and torch:\n{version.stderr[-2000:]}")
    joey_version, joey_torch = version.stdout.split()

    import torch

    from transformer_nmt.data.datamodule import TranslationDataModule
    from transformer_nmt.hardware import reported_cpu_flags
    from transformer_nmt.provenance import PROVENANCE_KEY
    from transformer_nmt.provenance import collect as collect_provenance

    cfg = race_recipe(args.precision)
    datamodule = TranslationDataModule(cfg.data, seed=cfg.seed)
    datamodule.setup("fit")  # trains (or finds in the cache) the recipe's SentencePiece model
    split = datamodule.splits["train"]
    keep = [int(i) for i in split.keep]
    src_lengths = [len(split.tokens[f"{datamodule.src_lang}_ids"][i]) for i in keep]
    tgt_lengths = [len(split.tokens[f"{datamodule.tgt_lang}_ids"][i]) for i in keep]
    ours_tokens = statistics.mean(sum(tgt_lengths[i] + 1 for i in batch) for batch in datamodule.batch_sampler("train"))
    batch_size = joey_batch_size(src_lengths, tgt_lengths, ours_tokens)
    report = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpu_flags": " ".join(reported_cpu_flags()),
              "cores": os.cpu_count(), "threads": args.threads, "precision": args.precision, "steps": args.steps,
              "torch": torch.__version__, "joeynmt": joey_version, "joeynmt_torch": joey_torch,
              "ours_mean_target_tokens_per_step": ours_tokens, "joeynmt_batch_size": batch_size,
              "ours_overrides": same_dropouts(cfg),
              PROVENANCE_KEY: collect_provenance({"options": vars(args) | {"json": str(args.json)}}), "rounds": []}
    with tempfile.TemporaryDirectory(prefix="joey_race_") as tmp:
        work, data = Path(tmp), Path(tmp) / "data"
        data.mkdir()
        for split, prefix in (("train", cfg.data.train), ("val", cfg.data.val)):
            for lang in (cfg.data.src_lang, cfg.data.tgt_lang):
                plain_copy(next(ROOT.glob(f"{prefix}.{lang}*")), data / f"{split}.{lang}")
        config = joey_config(cfg, Path(datamodule.tokenizer_path_used).resolve(), data, work, args.steps,
                             args.threads)
        config["training"]["batch_size"] = batch_size
        for r in range(args.rounds):
            ours = train_ours(work / f"ours_{r}", args.steps, args.threads, args.precision, same_dropouts(cfg))
            theirs = train_joey(args.joeynmt_python, config, work, args.steps, args.threads)
            report["rounds"].append({"ours": ours, "joeynmt": theirs, "load": os.getloadavg()})
            print(f"round {r}: ours {ours['train_tgt_tokens_per_sec']:.0f} tgt tok/s, JoeyNMT "
                  f"{theirs['train_tgt_tokens_per_sec']:.0f} ({theirs['mean_target_tokens_per_step']:.0f} target "
                  f"tokens a step; ours {ours_tokens:.0f}); load {os.getloadavg()[0]:.2f}", flush=True)
    ratios = [r["ours"]["train_tgt_tokens_per_sec"] / r["joeynmt"]["train_tgt_tokens_per_sec"]
              for r in report["rounds"]]
    report["median_ratio"] = statistics.median(ratios)
    ours_rate = statistics.median(r["ours"]["train_tgt_tokens_per_sec"] for r in report["rounds"])
    joey_rate = statistics.median(r["joeynmt"]["train_tgt_tokens_per_sec"] for r in report["rounds"])
    print(f"\nCPU flags: {report['cpu_flags']}; {args.threads} threads; precision {args.precision}; "
          f"{args.steps} steps x {args.rounds} rounds; torch {torch.__version__}, JoeyNMT {joey_version} "
          f"(torch {joey_torch}); JoeyNMT's batch_size {batch_size:,} (ours: data.max_tokens "
          f"{cfg.data.max_tokens:,})\n")
    print("| side | target tokens/s (median) | target tokens a step (mean) | ours / JoeyNMT (median of rounds) |")
    print("| --- | --- | --- | --- |")
    print(f"| ours (`experiment=multi30k_cpu`, trainer.precision={args.precision}) | {ours_rate:,.0f} | "
          f"{ours_tokens:,.0f} | {report['median_ratio']:.2f}x |")
    print(f"| JoeyNMT {joey_version} | {joey_rate:,.0f} | "
          f"{statistics.mean(r['joeynmt']['mean_target_tokens_per_step'] for r in report['rounds']):,.0f} | |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
