"""Sequence-level knowledge distillation (Kim & Rush 2016) on what we have, measured (issue 39).

    python studies/distillation.py teacher=outputs/multi30k_tiny_en_de/RUN/averaged.ckpt student=ablation_base \
        "seeds=[1,2]" out=docs/quality/distillation.json

1. The teacher translates the training split's sources (``python -m transformer_nmt.synthesize``, beam ``beam``):
   WORK/distilled/train.{SRC,TGT}, the original sources beside the teacher's translations.
2. The student experiment trains on the original pairs and on the distilled ones, for each seed, with the teacher's
   vocabulary (``data.tokenizer_path``: the SentencePiece model the teacher's checkpoint embeds), so that only the
   targets differ between the two; ``student_overrides`` go to both (before the study's own: data.train,
   data.tokenizer_path, seed and the run directory are the study's).
3. Each student's final weights (``checkpoints/last.ckpt``) and the teacher are scored on val and test (beam
   ``beam``, the checkpoint's own data, as ``evaluate split=...`` reads it).

Every step is skipped when its output exists: run the same command again and the study goes on where it stopped.
Writes ``out`` (JSON: each run's scores, the means over seeds, the step times, the provenance); the corpora, runs
and evaluations go under ``work`` (default outputs/distillation/, which git ignores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from study_steps import mean, parallel_files, run_step, save_vocabulary, score  # studies/: a multi-step study's steps

from transformer_nmt.checkpoint import read_checkpoint
from transformer_nmt.data.config import DataConfig
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"teacher": None, "student": "ablation_base", "student_overrides": [], "seeds": [1, 2], "beam": 5,
           "synthesize_overrides": [], "splits": ["val", "test"], "out": "distillation.json",
           "work": "outputs/distillation"}
USAGE = "python studies/distillation.py teacher=CKPT [student=EXPERIMENT] [seeds=[1,2]] [out=FILE.json]"


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["teacher"]:
        raise SystemExit("give teacher=CKPT: the model whose translations the student learns from")
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    work, teacher = Path(options["work"]), Path(options["teacher"])
    checkpoint = read_checkpoint(teacher, mmap=True)
    data = DataConfig.from_record(checkpoint["data_config"], f"teacher {teacher}")
    vocabulary = work / "teacher.spm.model"
    save_vocabulary(teacher, vocabulary)
    source = parallel_files(data.train, data.src_lang, data.tgt_lang)[0]
    distilled = work / "distilled" / "train"
    seconds = {"synthesize": run_step("synthesize", Path(f"{distilled}.{data.tgt_lang}"), [
        "transformer_nmt.synthesize", f"ckpt={teacher}", f"input={source}", f"output={distilled}",
        f"beam={options['beam']}", *options["synthesize_overrides"]])}
    runs = []
    for corpus, train in (("original", data.train), ("distilled", str(distilled))):
        for seed in options["seeds"]:
            run_dir = work / "runs" / corpus / f"seed{seed}"
            name = f"{corpus} seed {seed}"
            seconds[name] = run_step(name, run_dir / "results.json", [
                "transformer_nmt.train", f"experiment={options['student']}", *options["student_overrides"],
                f"data.train={train}", f"data.tokenizer_path={vocabulary}", f"seed={seed}",
                f"hydra.run.dir={run_dir}"])
            runs.append({"corpus": corpus, "seed": seed, "run_dir": str(run_dir),
                         "scores": score(run_dir / "checkpoints" / "last.ckpt", options["splits"], options["beam"],
                                         work / "eval" / corpus / f"seed{seed}")})
    teacher_scores = score(teacher, options["splits"], options["beam"], work / "eval" / "teacher")
    means = {corpus: {split: mean([r["scores"][split]["bleu"] for r in runs if r["corpus"] == corpus])
                      for split in options["splits"]} for corpus in ("original", "distilled")}
    result = {"options": options, "teacher": {"checkpoint": str(teacher), "scores": teacher_scores},
              "distilled_corpus": str(distilled), "runs": runs, "mean_bleu": means, "seconds": seconds,
              PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for corpus, row in means.items():
        print(f"student on {corpus} pairs: " + ", ".join(f"{s} BLEU {b}" for s, b in row.items()))
    print("teacher: " + ", ".join(f"{s} BLEU {v['bleu']}" for s, v in teacher_scores.items()))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
