"""The race a user would run: our trainer against transformers' Seq2SeqTrainer on a MarianMTModel of the same
shape, on Multi30k en->de, then decoding the same model three ways.

    python benchmarks/benchmark_hf_race.py                     # the full race (hours: for a quiet machine)
    python benchmarks/benchmark_hf_race.py --quick             # a few steps and sentences: shows it works
    python benchmarks/benchmark_hf_race.py --steps 200 --rounds 3 --minutes 30 --threads 2 --json race.json

Both sides train the recipe's shape (conf/experiment/multi30k_cpu.yaml: model=small, 3+3 layers, d_model 256,
4 heads, d_ff 1024, the 8k vocabulary the datamodule trains, its dropout, learning-rate peak and warmup, label
smoothing 0.1, Adam's betas and eps) at the recipe's precision for this CPU (bf16 autocast where the CPU has
native bf16, else fp32), on the same tokenized pairs (our datamodule's, filtered as the recipe filters them).
Ours: ``python -m transformer_nmt.train experiment=multi30k_cpu`` itself, in a subprocess (its batches: the
recipe's ``data.max_tokens`` padded target tokens at most). Theirs: ``Seq2SeqTrainer`` on ``MarianMTModel``
(our export of a fresh model of the recipe's config: the same init scheme), ``group_by_length`` (transformers 5:
``train_sampling_strategy="group_by_length"``) and ``bf16`` where we use it, ``DataCollatorForSeq2Seq``, a batch
size in sentences chosen so that its mean target tokens per batch equal ours (printed: both sides' real mean), in a
subprocess of this script (``--side hf``).

Throughput: ``--rounds`` rounds of ``--steps`` optimizer steps each, ours then theirs (alternating, so that a
drifting load hits both), target tokens/s over the timed steps (ours: results.json's, the step's own timer;
theirs: the same count over its steps after the first). Quality: each side trained for ``--minutes`` of wall
time, then greedy dev BLEU (ours: evaluate, beam 1; theirs: generate, greedy). Decoding: our model after its
wall-time run, on ``--sentences`` test sentences (test_2016_flickr, 1,000), beam 4, ``--threads`` threads: our
beam search, CTranslate2 (its export), ``model.generate`` (its MarianMT export, num_beams 4): seconds and BLEU.
Prints CPU flags, thread counts and load averages, and a markdown table; ``--json`` writes the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RACE_OVERRIDES = ["experiment=multi30k_cpu", "trainer.max_time=null", "train.val_bleu_max_sentences=0",
                  "trainer.limit_val_batches=0", "run_test=false", "attention_maps.every_n_validations=0",
                  "checkpoint.save_top_k=0", "checkpoint.recent.keep=0", "trainer.enable_progress_bar=false"]


def recipe(overrides: list[str]):
    """The composed recipe (the app's config) and the precision auto picks here."""
    from hydra import compose, initialize_config_dir

    from transformer_nmt.conf import CONF_DIR
    from transformer_nmt.training.config import register_configs
    from transformer_nmt.training.precision import resolve_precision
    from transformer_nmt.training.resolvers import register_resolvers

    register_configs()
    register_resolvers()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    return cfg, resolve_precision(str(cfg.trainer.precision), "cpu")[0]


def train_ours(run_dir: Path, steps: int | None, minutes: float | None, threads: int) -> dict:
    """python -m transformer_nmt.train on the recipe: results.json."""
    limit = [f"trainer.max_steps={steps}"] if steps else [f"trainer.max_time=00:00:{int(minutes):02d}:00",
                                                          "trainer.max_steps=-1"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "transformer_nmt.train", *RACE_OVERRIDES, *limit, f"hydra.run.dir={run_dir}",
                    "ckpt_path=null"], check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    results = json.loads((run_dir / "results.json").read_text())
    results["process_seconds"] = time.perf_counter() - started
    return results


def train_hf(args) -> dict:
    """One Seq2SeqTrainer run (``--side hf``): the recipe's model, data, schedule and precision, on MarianMTModel."""
    import torch
    import transformers
    from omegaconf import OmegaConf

    from transformer_nmt.data.datamodule import TranslationDataModule
    from transformer_nmt.interchange.marian import export_marian
    from transformer_nmt.model.transformer import Transformer, TransformerConfig

    torch.set_num_threads(args.threads)
    cfg, precision = recipe(RACE_OVERRIDES)
    datamodule = TranslationDataModule(cfg.data, seed=cfg.seed)
    datamodule.setup("fit")
    tokenizer = datamodule.tokenizer
    model_cfg = {**OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": tokenizer.vocab_size}
    torch.manual_seed(cfg.seed)
    directory = export_marian(Transformer(TransformerConfig(**model_cfg)), tokenizer,
                              Path(args.work) / "hf_init", force=True)
    model = transformers.MarianMTModel.from_pretrained(directory)
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    split = datamodule.splits["train"]
    src_col, tgt_col = split.tokens[f"{datamodule.src_lang}_ids"], split.tokens[f"{datamodule.tgt_lang}_ids"]
    keep = [int(i) for i in split.keep]
    eos = tokenizer.eos_id
    rows = {"input_ids": [list(src_col[i]) + [eos] for i in keep], "labels": [list(tgt_col[i]) + [eos] for i in keep]}
    dataset = __import__("datasets").Dataset.from_dict(rows)
    # Our batches' mean real target tokens (bos/eos counted as our step counts them), one epoch of the sampler:
    # their batch size in sentences gives the same mean.
    lengths = [len(r) for r in rows["labels"]]
    ours_batches = [sum(lengths[i] for i in batch) for batch in datamodule.batch_sampler("train")]
    ours_tokens = statistics.mean(ours_batches)
    batch_size = max(1, round(ours_tokens / statistics.mean(lengths)))
    base = transformers.DataCollatorForSeq2Seq(hf_tokenizer, model=model, padding=True)
    counted: list[int] = []

    def collate(features):
        batch = base(features)
        counted.append(int((batch["labels"] != -100).sum()))
        return batch

    step_times: list[float] = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.started = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_times.append(time.perf_counter() - self.started)

    class WallTime(transformers.TrainerCallback):
        def __init__(self, seconds):
            self.seconds, self.start = seconds, time.perf_counter()

        def on_step_end(self, _args, state, control, **k):
            if time.perf_counter() - self.start > self.seconds:
                control.should_training_stop = True

    # group_by_length (transformers 4) became train_sampling_strategy="group_by_length" (5)
    fields = transformers.Seq2SeqTrainingArguments.__dataclass_fields__
    bucketing = ({"train_sampling_strategy": "group_by_length"} if "train_sampling_strategy" in fields
                 else {"group_by_length": True})
    lr_peak = cfg.train.lr_factor * model_cfg["d_model"] ** -0.5 * cfg.train.warmup_steps ** -0.5
    training = transformers.Seq2SeqTrainingArguments(
        output_dir=str(Path(args.work) / "hf_run"), per_device_train_batch_size=batch_size,
        max_steps=args.steps if args.steps else 10 ** 9, learning_rate=lr_peak, warmup_steps=cfg.train.warmup_steps,
        lr_scheduler_type="inverse_sqrt", adam_beta1=cfg.train.betas[0], adam_beta2=cfg.train.betas[1],
        adam_epsilon=cfg.train.eps, weight_decay=0.0, label_smoothing_factor=cfg.train.label_smoothing,
        bf16=precision == "bf16-mixed", **bucketing, use_cpu=True, dataloader_num_workers=0,
        save_strategy="no", report_to=[], logging_steps=50, seed=cfg.seed, disable_tqdm=True)
    callbacks = [Timer()] + ([WallTime(args.minutes * 60)] if not args.steps else [])
    trainer = transformers.Seq2SeqTrainer(model=model, args=training, train_dataset=dataset, data_collator=collate,
                                          callbacks=callbacks)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    timed = step_times[1:] or step_times
    tokens = counted[1:len(step_times)] or counted[:len(step_times)]
    result = {"steps": len(step_times), "batch_size": batch_size, "ours_mean_target_tokens_per_batch": ours_tokens,
              "mean_target_tokens_per_batch":
              statistics.mean(counted[:len(step_times)]), "train_tgt_tokens_per_sec": sum(tokens) / sum(timed),
              "train_seconds": seconds, "precision": precision, "torch_threads": torch.get_num_threads()}
    if not args.steps:  # the quality race: greedy dev BLEU after the wall time
        from sacrebleu import corpus_bleu

        from transformer_nmt.inference.translate import read_lines

        src = read_lines(ROOT / "data/multi30k/val.en.gz")[: args.sentences]
        ref = read_lines(ROOT / "data/multi30k/val.de.gz")[: args.sentences]
        model.eval()
        hyps = []
        with torch.no_grad():
            for i in range(0, len(src), 64):
                enc = hf_tokenizer(src[i:i + 64], return_tensors="pt", padding=True)
                hyps += hf_tokenizer.batch_decode(model.generate(**enc, num_beams=1), skip_special_tokens=True)
        result["dev_bleu_greedy"] = corpus_bleu(hyps, [ref]).score
    return result


def run_hf(args, work: Path, steps: int | None, minutes: float | None) -> dict:
    command = [sys.executable, __file__, "--side", "hf", "--work", str(work), "--threads", str(args.threads),
               "--sentences", str(args.sentences)]
    command += ["--steps", str(steps)] if steps else ["--steps", "0", "--minutes", str(minutes)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode_race(ckpt: Path, args, work: Path) -> list[dict]:
    """Our beam search, CTranslate2 and model.generate on the test sentences: seconds and BLEU."""
    import torch
    import transformers

    from transformer_nmt.checkpoint import load_checkpoint
    from transformer_nmt.generation.config import DecodeConfig
    from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
    from transformer_nmt.inference.evaluate import score
    from transformer_nmt.inference.export import export_model
    from transformer_nmt.inference.translate import read_lines, translate_lines
    from transformer_nmt.interchange.marian import export_marian

    torch.set_num_threads(args.threads)
    src = read_lines(ROOT / "data/multi30k/test_2016_flickr.en.gz")[: args.sentences]
    ref = read_lines(ROOT / "data/multi30k/test_2016_flickr.de.gz")[: args.sentences]
    model, tokenizer, meta = load_checkpoint(ckpt)
    ct2 = CTranslate2Model(export_model(model, tokenizer, work / "ct2", meta=meta, force=True), "cpu", "default",
                           args.threads, 1)
    directory = export_marian(model, tokenizer, work / "marian", meta, force=True)
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(directory)

    def generate():
        hyps = []
        with torch.no_grad():
            for i in range(0, len(src), 64):
                enc = hf_tokenizer(src[i:i + 64], return_tensors="pt", padding=True)
                # our limit is each source's length + 50; transformers has one per batch: the longest's
                limit = int(enc["attention_mask"].sum(dim=1).max()) + DecodeConfig().max_len_offset
                hyps += hf_tokenizer.batch_decode(hf_model.generate(**enc, num_beams=4, max_new_tokens=limit),
                                                  skip_special_tokens=True)
        return hyps

    rows = []
    for name, run in (("ours (beam 4, native)", lambda: [h[0][0] for h in translate_lines(model, tokenizer, src)]),
                      ("CTranslate2 (beam 4)", lambda: [h[0][0] for h in translate_lines(ct2, tokenizer, src)]),
                      ("transformers generate (num_beams 4)", generate)):
        started = time.perf_counter()
        hyps = run()
        rows.append({"decoder": name, "seconds": time.perf_counter() - started, **score(hyps, ref)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 steps a side, 1 round, no wall-time race, 20 sentences")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per side per round (0: wall time)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=30.0, help="the quality race: wall time per side")
    parser.add_argument("--sentences", type=int, default=1000, help="decoded test (and dev BLEU) sentences")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the raw numbers here")
    parser.add_argument("--side", choices=["hf"], help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "hf":
        print(json.dumps(train_hf(args)))
        return
    if args.quick:
        args.steps, args.rounds, args.minutes, args.sentences = 3, 1, 0, 20
    from transformer_nmt.hardware import reported_cpu_flags

    work = Path(tempfile.mkdtemp(prefix="hf_race_"))
    print(f"CPU flags {reported_cpu_flags()}, {args.threads} threads, load {os.getloadavg()}, work dir {work}")
    report = {"cpu_flags": reported_cpu_flags(), "threads": args.threads, "load_before": os.getloadavg(),
              "args": vars(args), "rounds": []}
    for r in range(args.rounds):
        ours = train_ours(work / f"ours_{r}", args.steps, None, args.threads)
        theirs = run_hf(args, work / f"hf_{r}", args.steps, None)
        report["rounds"].append({"ours": ours, "hf": theirs})
        print(f"round {r}: ours {ours['train_tgt_tokens_per_sec']:.0f} tgt tok/s, transformers "
              f"{theirs['train_tgt_tokens_per_sec']:.0f} tgt tok/s (batch {theirs['batch_size']} sentences, "
              f"{theirs['mean_target_tokens_per_batch']:.0f} target tokens; ours "
              f"{theirs['ours_mean_target_tokens_per_batch']:.0f})")
    ratios = [r["ours"]["train_tgt_tokens_per_sec"] / r["hf"]["train_tgt_tokens_per_sec"] for r in report["rounds"]]
    lines = ["| measure | ours | transformers | ours / theirs |", "| --- | --- | --- | --- |",
             f"| training target tokens/s (median of {args.rounds} rounds of {args.steps} steps) | "
             f"{statistics.median(r['ours']['train_tgt_tokens_per_sec'] for r in report['rounds']):.0f} | "
             f"{statistics.median(r['hf']['train_tgt_tokens_per_sec'] for r in report['rounds']):.0f} | "
             f"{statistics.median(ratios):.2f}x |"]
    ckpt = None
    if args.minutes:
        ours = train_ours(work / "ours_wall", None, args.minutes, args.threads)
        ckpt = work / "ours_wall" / "checkpoints" / "last.ckpt"
        evaluation = subprocess.run([sys.executable, "-m", "transformer_nmt.evaluate", f"ckpt={ckpt}", "split=val",
                                     "beam=1", f"threads={args.threads}", f"out={work / 'eval'}"],
                                    check=True, capture_output=True, text=True, cwd=ROOT)
        ours_bleu = json.loads((work / "eval" / "val.json").read_text())["bleu"]
        theirs = run_hf(args, work / "hf_wall", None, args.minutes)
        report["wall_time"] = {"ours": {**ours, "dev_bleu_greedy": ours_bleu}, "hf": theirs,
                               "evaluate_stdout_tail": evaluation.stdout[-500:]}
        lines.append(f"| greedy dev BLEU after {args.minutes:g} minutes | {ours_bleu:.2f} | "
                     f"{theirs['dev_bleu_greedy']:.2f} | {ours_bleu - theirs['dev_bleu_greedy']:+.2f} |")
    else:
        ckpt = work / "ours_0" / "checkpoints" / "last.ckpt"
    report["decoding"] = decode_race(ckpt, args, work)
    lines += ["", f"| decoder ({args.sentences} test sentences, {args.threads} threads) | seconds | BLEU |",
              "| --- | --- | --- |"] + [f"| {d['decoder']} | {d['seconds']:.1f} | {d['bleu']:.2f} |"
                                       for d in report["decoding"]]
    report["load_after"] = os.getloadavg()
    print("\n".join(lines))
    print(f"load before {report['load_before']}, after {report['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
