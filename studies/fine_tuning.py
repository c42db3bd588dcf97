"""Fine-tuning against training from scratch, with and without frozen weights, and what the parent forgets
(issue 39).

    python studies/fine_tuning.py parent=outputs/multi30k_tiny_en_de/RUN/averaged.ckpt experiment=multi30k_tiny \
        pairs=2000 "seeds=[1,2]" out=docs/quality/fine_tuning.json

The shifted task is the reverse direction over the parent's shared vocabulary (an en->de parent learns de->en):

1. The first ``pairs`` pairs of the training split, reversed, are the new task's training pairs (WORK/pairs/train);
   its held-out pairs are the validation and test splits, reversed.
2. For each seed, three runs of ``experiment`` (the parent's architecture) on those pairs, each with the parent's
   vocabulary (``data.tokenizer_path``): from scratch; fine-tuned from the parent (``init_from``) with
   ``fine_tune_overrides`` (its schedule: e.g. a constant lr); and the same with ``freeze`` (``train.freeze``).
   ``overrides`` go to all three (e.g. trainer.max_steps).
3. Each run's final weights are scored on the new task's val and test, and on the parent's own task (its val, the
   original direction: what fine-tuning forgot); the parent too, as the reference of both.

Every step is skipped when its output exists: run the same command again and the study goes on where it stopped.
Writes ``out`` (JSON: each run's scores, the means over seeds, the step times, the provenance); the runs and
evaluations go under ``work`` (default outputs/fine_tuning/, which git ignores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from study_steps import (  # studies/: the steps of a multi-step study
    SCORES,
    mean,
    parallel_files,
    parallel_lines,
    run_step,
    score,
)

from transformer_nmt.checkpoint import checkpoint_tokenizer, read_checkpoint
from transformer_nmt.data.config import DataConfig
from transformer_nmt.inference.evaluate import main as evaluate
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"parent": None, "experiment": "multi30k_tiny", "overrides": [], "pairs": 2000, "seeds": [1, 2],
           "fine_tune_overrides": ["train.lr=5e-4", "train.warmup_steps=0", "train.lr_schedule=constant"],
           "freeze": ["src_embed.*"], "beam": 5, "splits": ["val", "test"], "out": "fine_tuning.json",
           "work": "outputs/fine_tuning"}
USAGE = "python studies/fine_tuning.py parent=CKPT [experiment=multi30k_tiny] [pairs=2000] [out=FILE.json]"


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["parent"]:
        raise SystemExit("give parent=CKPT: the model to fine-tune")
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    work, parent = Path(options["work"]), Path(options["parent"])
    checkpoint = read_checkpoint(parent, mmap=True)
    data = DataConfig.from_record(checkpoint["data_config"], f"parent {parent}")
    src, tgt = data.tgt_lang, data.src_lang  # the new task: the reverse direction
    vocabulary = work / "parent.spm.model"
    pairs = work / "pairs" / "train"
    if not Path(f"{pairs}.{src}").exists():
        pairs.parent.mkdir(parents=True, exist_ok=True)
        checkpoint_tokenizer(checkpoint, f"parent {parent}").save(vocabulary)
        sides = dict(zip((src, tgt), parallel_lines(data.train, src, tgt)))
        for lang in (tgt, src):  # the source side last: it marks the step done
            chosen = sides[lang][: options["pairs"]]
            Path(f"{pairs}.{lang}").write_text("".join(line + "\n" for line in chosen), encoding="utf-8")
    task = [f"data.train={pairs}", f"data.src_lang={src}", f"data.tgt_lang={tgt}", f"data.tokenizer_path={vocabulary}"]
    kinds = {"from scratch": [],
             "fine-tuned": [f"init_from={parent}", *options["fine_tune_overrides"]],
             "fine-tuned, frozen": [f"init_from={parent}", *options["fine_tune_overrides"],
                                    f"train.freeze=[{','.join(options['freeze'])}]"]}
    seconds, runs = {}, []
    old_task = dict(zip(("src", "ref"), parallel_files(data.val, data.src_lang, data.tgt_lang)))

    def forgetting(ckpt: Path, out: Path) -> dict:
        """The parent's own task: its validation split in its own direction."""
        result = evaluate([f"ckpt={ckpt}", f"src={old_task['src']}", f"ref={old_task['ref']}",
                           f"beam={options['beam']}", f"out={out}"])
        return {key: result.get(key) for key in SCORES}

    for kind, extra in kinds.items():
        for seed in options["seeds"]:
            run_dir = work / "runs" / kind.replace(", ", "_").replace(" ", "_") / f"seed{seed}"
            step = f"{kind}, seed {seed}"
            seconds[step] = run_step(step, run_dir / "results.json", [
                "transformer_nmt.train", f"experiment={options['experiment']}", *options["overrides"], *extra, *task,
                f"seed={seed}", f"hydra.run.dir={run_dir}"])
            ckpt = run_dir / "checkpoints" / "last.ckpt"
            eval_dir = work / "eval" / run_dir.relative_to(work / "runs")
            runs.append({"kind": kind, "seed": seed, "run_dir": str(run_dir),
                         "scores": score(ckpt, options["splits"], options["beam"], eval_dir),
                         "parent_task": forgetting(ckpt, eval_dir / "parent_task")})
    means = {kind: {**{split: mean([r["scores"][split]["bleu"] for r in runs if r["kind"] == kind])
                       for split in options["splits"]},
                    "parent_task": mean([r["parent_task"]["bleu"] for r in runs if r["kind"] == kind])}
             for kind in kinds}
    result = {"options": options, "task": {"src_lang": src, "tgt_lang": tgt, "train": str(pairs)},
              "parent": {"checkpoint": str(parent), "parent_task": forgetting(parent, work / "eval" / "parent")},
              "runs": runs, "mean_bleu": means, "seconds": seconds, PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for kind, row in means.items():
        print(f"{kind}: " + ", ".join(f"{split} BLEU {bleu}" for split, bleu in row.items()))
    print(f"parent on its own task: BLEU {result['parent']['parent_task']['bleu']}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
