"""The best text-only Multi30k model within a fixed compute budget, step by step, each step measured on val
(issue 51, item 3): teachers, their ensemble, the ensemble's translations of the training sources, a student.

    python studies/best_model.py                                   # the default plan (about 3.75 hours of the budget)
    python studies/best_model.py "teachers=[1234,2]" student_updates=7791 student_corpus=both out=docs/quality/best

The budget is counted in updates of the CPU hour, as the hour's seeds are (studies/recipe_seeds.py): the hour on
a quiet native-bf16 host gave run I ``hour_updates`` (5,194) updates of ~4k-token batches, so N updates are
N / ``hour_updates`` hours of that host whichever host trains them (a slower one takes longer, a loaded one too,
and computes the same). A plan whose training exceeds ``budget_hours`` is refused before anything runs; the
synthesis and the evaluations are measured in this host's seconds and reported beside.

1. **Teachers**: the recipe (experiment=multi30k_cpu) with each seed of ``teachers``, ``hour_updates`` updates each:
   ``python -m transformer_nmt.reproduce run_id=PREFIX_teacher_S seed=S trainer.max_time=null
   trainer.max_steps=hour_updates`` (it averages, chooses the checkpoint and the length penalty on val).
2. **Their ensemble** (``ckpt=[A,B,...]``, each teacher's chosen checkpoint) on val at beam ``beam`` with each
   GNMT exponent of ``alphas``: the best on val is the ensemble's search.
3. **The distilled corpus** (sequence-level knowledge distillation, Kim & Rush 2016): the ensemble translates the
   training sources with that search (``python -m transformer_nmt.synthesize``): WORK/distilled/train.{SRC,TGT}.
   ``student_corpus=both`` trains on the original pairs followed by the distilled ones (WORK/both/train.*);
   ``distilled`` on the distilled pairs alone (what docs/quality.md's distillation study measured).
4. **The student**: the recipe again (seed ``student_seed``), ``student_updates`` updates, on that corpus with the
   teachers' SentencePiece model (``data.tokenizer_path``), through reproduce (averaged, chosen on val).

Every step is skipped when its output exists: run the same command again and the study goes on where it stopped (a
reproduce run killed mid-training resumes from its last checkpoint), and what a step leaves is kept as it ends, so
that a study spread over sessions commits each finished step: each reproduce run's reports and its chosen model's
val and test hypotheses go to ``out`` as studies/recipe_seeds.py keeps them (NAME_reproduce.json,
NAME_results.json, hyps/NAME/). At the end, ``out``/best_model.json: each step's val scores (cased and
Multi30k-convention BLEU, chrF), its compute, and which model val chooses (the highest val BLEU among the teachers,
the ensemble and the student); test is reported for that one only, and the choice never reads it. The chosen model
translates the ``blind`` sources once (references withheld, scored elsewhere) into ``blind_out``/best_model/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from recipe_seeds import chosen_checkpoint, keep_reports, translate_blind  # studies/: a reproduce run kept
from study_steps import evaluate_once, parallel_files, run_step  # studies/: the steps of a multi-step study

from transformer_nmt.checkpoint import checkpoint_tokenizer, read_checkpoint
from transformer_nmt.data.config import DataConfig
from transformer_nmt.inference.translate import read_lines
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"teachers": [1234, 2], "hour_updates": 5194, "student_updates": 7791, "student_seed": 7,
           "student_corpus": "distilled", "budget_hours": 4.0, "beam": 4, "alphas": [0.6, 1.0, 1.4],
           "tgt_lang": "de", "prefix": "best", "runs": "outputs/multi30k_cpu_en_de", "work": "outputs/best_model",
           "out": "docs/quality/best", "blind": "data/multi30k/blind", "blind_out": "docs/quality/blind"}
USAGE = ('python studies/best_model.py ["teachers=[1234,2]"] [student_updates=7791] [student_corpus=distilled|both] '
         "[out=docs/quality/best]")
CORPORA = ("distilled", "both")
REPORTED = ("bleu", "bleu_multi30k", "chrf", "length_ratio")


def training_hours(options: dict) -> float:
    """The plan's training in hours of the budget's host: every update counted at the hour's rate."""
    updates = options["hour_updates"] * len(options["teachers"]) + options["student_updates"]
    return round(updates / options["hour_updates"], 3)


def check_plan(options: dict) -> None:
    """Refuse, naming the option, a plan that cannot run as asked: before any step starts."""
    if not options["teachers"]:
        raise SystemExit("teachers=[...]: give at least one seed")
    if len(set(options["teachers"])) != len(options["teachers"]):
        raise SystemExit(f"teachers={options['teachers']}: a seed twice trains the same teacher twice")
    if options["student_corpus"] not in CORPORA:
        raise SystemExit(f"student_corpus={options['student_corpus']!r}: one of {', '.join(CORPORA)}")
    if options["hour_updates"] < 1 or options["student_updates"] < 1:
        raise SystemExit("hour_updates and student_updates: at least 1 update")
    if not options["alphas"]:
        raise SystemExit("alphas=[...]: give the length penalty's exponents to choose among on val")
    hours = training_hours(options)
    if hours > options["budget_hours"]:
        raise SystemExit(f"the plan trains {hours:g} hours of the budget's host ({len(options['teachers'])} teachers "
                         f"x {options['hour_updates']} + {options['student_updates']} student updates, at "
                         f"{options['hour_updates']} an hour), over budget_hours={options['budget_hours']:g}")


def reproduce_run(name: str, run_dir: Path, overrides: list[str], out: Path, tgt: str) -> dict:
    """A reproduce run (trained unless its reproduce.json exists), its reports and hypotheses kept in ``out``: its
    report and seconds."""
    seconds = run_step(name, run_dir / "reproduce.json", ["transformer_nmt.reproduce", f"run_id={run_dir.name}",
                                                          "trainer.max_time=null", *overrides])
    return {"report": keep_reports(run_dir, out, tgt), "seconds": seconds}


def chosen_scores(report: dict, split: str) -> dict:
    """reproduce's scores of its chosen checkpoint with its chosen search on ``split``."""
    key = f"{split}_beam{report['search']['beam']}"
    return {k: report["scores"][key].get(k) for k in REPORTED}


def ensemble_search(ensemble: str, options: dict, out: Path) -> tuple[float, dict]:
    """The ensemble's (``[A,B,...]``) GNMT exponent chosen on val among ``alphas`` (the first of a tie), and every
    alpha's val scores."""
    by_alpha = {}
    for alpha in options["alphas"]:
        record = evaluate_once(ensemble, out, f"val_ensemble_beam{options['beam']}_gnmt{alpha:g}",
                               ["split=val", f"beam={options['beam']}", "length_penalty=gnmt", f"alpha={alpha}"])
        by_alpha[alpha] = {k: record.get(k) for k in REPORTED}
    best = max(options["alphas"], key=lambda a: (by_alpha[a]["bleu"], -options["alphas"].index(a)))
    return best, by_alpha


def student_corpus(original: str, distilled: Path, work: Path, src: str, tgt: str, corpus: str) -> Path:
    """The student's training prefix: the distilled pairs, or the original pairs followed by them (written once,
    line counts checked)."""
    if corpus == "distilled":
        return distilled
    both = work / "both" / "train"
    if Path(f"{both}.{tgt}").exists():
        return both
    both.parent.mkdir(parents=True, exist_ok=True)
    for lang, first, second in zip((src, tgt), parallel_files(original, src, tgt), parallel_files(distilled, src, tgt)):
        lines = read_lines(first) + read_lines(second)
        partial = Path(f"{both}.{lang}.partial")
        partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    counts = {lang: len(read_lines(Path(f"{both}.{lang}.partial"))) for lang in (src, tgt)}
    if counts[src] != counts[tgt]:
        raise SystemExit(f"{both}: {counts[src]} {src} lines, {counts[tgt]} {tgt} lines")
    for lang in (src, tgt):  # the target last: its existence marks the corpus done
        Path(f"{both}.{lang}.partial").replace(f"{both}.{lang}")
    return both


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    check_plan(options)
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    runs, work, out = Path(options["runs"]), Path(options["work"]), Path(options["out"])
    prefix, seconds, steps = options["prefix"], {}, []

    teachers = []
    for seed in options["teachers"]:
        run_dir = runs / f"{prefix}_teacher_{seed}"
        done = reproduce_run(f"teacher seed {seed}", run_dir, [
            f"seed={seed}", f"trainer.max_steps={options['hour_updates']}"], out, options["tgt_lang"])
        seconds[f"teacher seed {seed}"] = done["seconds"]
        ckpt = chosen_checkpoint(run_dir, done["report"]["chosen"])
        teachers.append(ckpt)
        steps.append({"step": f"teacher, seed {seed}", "model": str(ckpt), "updates": options["hour_updates"],
                      "minutes_here": done["report"].get("total_minutes"),
                      "search": done["report"]["search"], "val": chosen_scores(done["report"], "val"),
                      "test": chosen_scores(done["report"], "test")})

    checkpoint = read_checkpoint(teachers[0], mmap=True)
    data = DataConfig.from_record(checkpoint["data_config"], f"teacher {teachers[0]}")
    if data.tgt_lang != options["tgt_lang"]:
        raise SystemExit(f"tgt_lang={options['tgt_lang']}: the teachers translate into {data.tgt_lang}")
    vocabulary = work / "teacher.spm.model"
    if not vocabulary.exists():
        vocabulary.parent.mkdir(parents=True, exist_ok=True)
        checkpoint_tokenizer(checkpoint, f"teacher {teachers[0]}").save(vocabulary)

    ensemble = f"[{','.join(str(t) for t in teachers)}]" if len(teachers) > 1 else str(teachers[0])
    search = dict(steps[0]["search"])  # one teacher: its own
    if len(teachers) > 1:
        alpha, by_alpha = ensemble_search(ensemble, options, work / "eval")
        search = {"beam": options["beam"], "length_penalty": "gnmt", "alpha": alpha}
        steps.append({"step": f"ensemble of the {len(teachers)} teachers", "model": ensemble, "updates": 0,
                      "search": search, "val": by_alpha[alpha], "val_by_alpha": by_alpha})

    source = parallel_files(data.train, data.src_lang, data.tgt_lang)[0]
    distilled = work / "distilled" / "train"
    seconds["synthesize"] = run_step("synthesize", Path(f"{distilled}.{data.tgt_lang}"), [
        "transformer_nmt.synthesize", f"ckpt={ensemble}", f"input={source}", f"output={distilled}",
        f"beam={search['beam']}", f"length_penalty={search['length_penalty']}", f"alpha={search['alpha']}"])
    train = student_corpus(data.train, distilled, work, data.src_lang, data.tgt_lang, options["student_corpus"])

    run_dir = runs / f"{prefix}_student_{options['student_corpus']}_{options['student_seed']}"
    done = reproduce_run("student", run_dir, [
        f"seed={options['student_seed']}", f"trainer.max_steps={options['student_updates']}", f"data.train={train}",
        f"data.tokenizer_path={vocabulary}"], out, data.tgt_lang)
    seconds["student"] = done["seconds"]
    student = chosen_checkpoint(run_dir, done["report"]["chosen"])
    steps.append({"step": f"student on the {options['student_corpus']} corpus", "model": str(student),
                  "updates": options["student_updates"], "minutes_here": done["report"].get("total_minutes"),
                  "search": done["report"]["search"],
                  "val": chosen_scores(done["report"], "val"), "test": chosen_scores(done["report"], "test")})

    chosen = max(range(len(steps)), key=lambda i: (steps[i]["val"]["bleu"], -i))
    best = steps[chosen]
    if "test" not in best:  # the ensemble: scored on test once, as chosen
        record = evaluate_once(ensemble, work / "eval", f"test_ensemble_beam{search['beam']}_gnmt{search['alpha']:g}",
                               ["split=test", f"beam={search['beam']}", "length_penalty=gnmt",
                                f"alpha={search['alpha']}"])
        best["test"] = {k: record.get(k) for k in REPORTED}
    for step in steps:  # test only for the model val chose
        if step is not best:
            step.pop("test", None)
    translate_blind(best["model"], best["search"], Path(options["blind"]), Path(options["blind_out"]) / "best_model",
                    data.tgt_lang)
    result = {"options": options, "training_hours": training_hours(options), "steps": steps,
              "chosen": best["step"], "chosen_on": "val bleu", "seconds": seconds,
              PROVENANCE_KEY: provenance}
    out.mkdir(parents=True, exist_ok=True)
    (out / "best_model.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for step in steps:
        print(f"{step['step']}: val BLEU {step['val']['bleu']} ({step['val']['bleu_multi30k']} Multi30k convention)"
              + (f"; test {step['test']['bleu']} ({step['test']['bleu_multi30k']})" if "test" in step else ""))
    print(f"chosen on val: {result['chosen']}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
