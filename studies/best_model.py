"""The best text-only Multi30k model within a fixed compute budget, step by step, each step measured on val
(issue 51, item 3): teachers, their ensemble, the ensemble's translations of the training sources, a student.

    python studies/best_model.py                              # the default plan: 3.5 hours of the budget's training
    python studies/best_model.py "teachers=[1234,2]" student_updates=7791 student_corpus=both

The budget is counted in updates of the CPU hour's bf16 recipe, as the hour's seeds are (studies/recipe_seeds.py):
the hour gave run I 5,194 updates on a quiet native-bf16 host (``HOUR_UPDATES``, reproduce's reference for the
bf16 recipe), so N updates are N / 5,194 hours of that host, whichever host trains them: a slower or a loaded one
takes longer and computes the same. The recipe's settings follow the precision ``trainer.precision=auto`` picks
(docs/quality.md, "Settings by precision"), so the study runs only where auto picks bf16-mixed (a CPU with native
bf16, or ``TRANSFORMER_NMT_CPU_BF16=native`` to train the bf16 recipe in emulated bf16, slowly). A plan whose
training exceeds ``budget_hours`` is refused before anything runs; the synthesis and the evaluations are not
counted in it: their minutes on the host that ran them are in the report.

1. **Teachers**: the recipe (experiment=multi30k_cpu) with each seed of ``teachers``, ``HOUR_UPDATES`` updates,
   ``python -m transformer_nmt.reproduce run_id=RUN seed=S trainer.max_time=null trainer.max_steps=5194
   test=false`` (it averages, then chooses the checkpoint and the length penalty on val). RUN is
   ``teacher_prefix`` and the seed: seed_S by default, the seeds' own run ids, so that a seed already trained is a
   teacher as it is.
2. **Their ensemble** (``ckpt=[A,B,...]``, each teacher's chosen checkpoint) on val, with the teachers' beam and
   length penalty and each exponent they tried: the best on val is the ensemble's search.
3. **The distilled corpus** (sequence-level knowledge distillation, Kim & Rush 2016): the ensemble (or the one
   teacher) translates the training sources with that search (``python -m transformer_nmt.synthesize``):
   WORK/distilled/train.{SRC,TGT}.
4. **The student**: the recipe again (seed ``student_seed``), ``student_updates`` updates, on the distilled pairs
   (``student_corpus=distilled``) or on the original pairs and the distilled ones (``both``), with the teachers'
   SentencePiece model (``data.tokenizer_path``), through reproduce as in step 1.
5. **The choice**: the model with the highest val BLEU among the teachers, the ensemble and the student, recorded in
   ``out``/choice.json before anything is scored with it (a later launch that chooses otherwise is refused). It
   alone is scored on test, once (every run the study trains scores with ``test=false``; a run it finds already
   trained must have the step's overrides and updates); it translates the ``blind``
   sources once (references withheld, scored elsewhere) into ``blind_out``/best_model/.

Every step is skipped when its output exists, so the same command goes on where it stopped (a reproduce run killed
mid-training resumes from its last checkpoint), and WORK/plan.json refuses a changed plan over the same WORK. What
a step leaves is kept as it ends, so that a study spread over sessions commits each finished step: each reproduce
run's reports and its chosen model's val hypotheses go to ``out`` (NAME_reproduce.json, NAME_results.json,
hyps/NAME/val.TGT, as studies/recipe_seeds.py keeps them). At the end, ``out``/best_model.json holds each step's
val scores (cased and Multi30k-convention BLEU, chrF), its updates and minutes, the choice, and test for the chosen
model, whose val and test hypotheses are ``out``/hyps/best_model/.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from recipe_seeds import OPTIONS as SEEDS_OPTIONS  # studies/: the hour's seeds, kept
from recipe_seeds import chosen_checkpoint, chosen_evaluation, keep_reports, translate_blind
from study_steps import evaluate_once, model_argument, parallel_files, run_step, save_vocabulary

from transformer_nmt.analysis.reproduce import REFERENCE_HOURS, run_directory
from transformer_nmt.checkpoint import read_checkpoint
from transformer_nmt.data.config import DataConfig
from transformer_nmt.hardware import CPU_BF16_ENV
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance
from transformer_nmt.training.precision import resolve_precision

RECIPE, PRECISION = "multi30k_cpu", "bf16-mixed"
HOUR_UPDATES = REFERENCE_HOURS[(f"{RECIPE}_en_de", PRECISION)]["steps"]  # run I's hour: 5,194 updates
OPTIONS = {"teachers": [1234, 2], "teacher_prefix": "seed_", "student_updates": 7791, "student_seed": 7,
           "student_corpus": "distilled", "budget_hours": 4.0, "work": "outputs/best_model",
           "out": "docs/quality/best", "blind": SEEDS_OPTIONS["blind"], "blind_out": SEEDS_OPTIONS["blind_out"]}
USAGE = ('python studies/best_model.py ["teachers=[1234,2]"] [student_updates=7791] [student_corpus=distilled|both] '
         "[out=docs/quality/best]")
CORPORA = ("distilled", "both")
REPORTED = ("bleu", "bleu_multi30k", "chrf", "length_ratio")
PLAN = ("teachers", "teacher_prefix", "student_updates", "student_seed", "student_corpus")  # what WORK's outputs are


def training_hours(options: dict) -> float:
    """The plan's training in hours of the budget's host: every update counted at the hour's rate."""
    return round((HOUR_UPDATES * len(options["teachers"]) + options["student_updates"]) / HOUR_UPDATES, 3)


def check_plan(options: dict) -> None:
    """Refuse, naming the option, a plan that cannot run as asked: before any step starts."""
    if not options["teachers"]:
        raise SystemExit("teachers=[...]: give at least one seed")
    if len(set(options["teachers"])) != len(options["teachers"]):
        raise SystemExit(f"teachers={options['teachers']}: a seed twice trains the same teacher twice")
    if not options["teacher_prefix"] or "/" in options["teacher_prefix"]:
        raise SystemExit(f"teacher_prefix={options['teacher_prefix']!r}: a run id's start, no directory")
    if options["student_corpus"] not in CORPORA:
        raise SystemExit(f"student_corpus={options['student_corpus']!r}: one of {', '.join(CORPORA)}")
    if options["student_updates"] < 1:
        raise SystemExit("student_updates: at least 1 update")
    hours = training_hours(options)
    if hours > options["budget_hours"]:
        raise SystemExit(f"the plan trains {hours:g} hours of the budget's host ({len(options['teachers'])} teachers "
                         f"x {HOUR_UPDATES} + {options['student_updates']} student updates, at {HOUR_UPDATES} an "
                         f"hour), over budget_hours={options['budget_hours']:g}")
    precision, why = resolve_precision("auto", "cpu")
    if precision != PRECISION:
        raise SystemExit(f"trainer.precision=auto picks {precision} here ({why}): the budget is the {PRECISION} "
                         f"recipe's; run on a CPU with native bf16, or set {CPU_BF16_ENV}=native to train it in "
                         f"emulated bf16 (slower, the same updates)")


def check_work(options: dict, work: Path) -> None:
    """WORK/plan.json: the options WORK's outputs depend on, written at the first launch; a later launch with other
    values is refused, naming them, before it could reuse a corpus or a student made for another plan."""
    plan, record = {key: options[key] for key in PLAN}, work / "plan.json"
    if record.is_file():
        before = json.loads(record.read_text(encoding="utf-8"))
        changed = [f"{key}: {before.get(key)!r} -> {plan[key]!r}" for key in PLAN if before.get(key) != plan[key]]
        if changed:
            raise SystemExit(f"work={work} holds the steps of another plan ({'; '.join(changed)}): give another "
                             f"work= or remove {work}")
        return
    work.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")


def reproduce_run(name: str, run_id: str, overrides: list[str], out: Path) -> dict:
    """A reproduce run of the recipe with ``test=false`` (trained unless its reproduce.json exists), kept in ``out``
    with its chosen model's val hypotheses: the step's record (its chosen checkpoint, search, val scores)."""
    train = [f"experiment={RECIPE}", f"run_id={run_id}", "trainer.max_time=null", *overrides]
    run_dir = run_directory(train, Path())  # relative to the launch directory, as the report names it
    run_step(name, run_dir / "reproduce.json", ["transformer_nmt.reproduce", *train[1:], "test=false"])
    found = json.loads((run_dir / "reproduce.json").read_text(encoding="utf-8"))
    missing = [o for o in train[1:] if o not in found.get("overrides", [])]
    steps = int(next(o for o in overrides if o.startswith("trainer.max_steps=")).split("=", 1)[1])
    if missing or found.get("trained", {}).get("steps") != steps:
        raise SystemExit(f"{run_dir}/reproduce.json is another run than this step's (overrides it lacks: "
                         f"{missing or 'none'}; trained {found.get('trained', {}).get('steps')} of {steps} updates): "
                         f"give another teacher_prefix= or remove {run_dir}")
    ckpt = chosen_checkpoint(run_dir, found["chosen"])
    tgt = DataConfig.from_record(read_checkpoint(ckpt, mmap=True)["data_config"], str(ckpt)).tgt_lang
    report = keep_reports(run_dir, out, tgt, splits=("val",))
    search = report["search"]
    return {"step": name, "model": str(ckpt), "run": run_id, "updates": report["trained"]["steps"],
            "minutes_here": report.get("total_minutes"), "search": search,
            "val": {k: report["scores"][f"val_beam{search['beam']}"].get(k) for k in REPORTED},
            "val_hyp": str(run_dir / "eval" / f"{chosen_evaluation(report, 'val')}.hyp"),
            "alphas": [float(a) for a in report["val_bleu_by_alpha"]]}


def scored(label: str, ckpt: str, split: str, search: dict, out: Path) -> tuple[dict, Path]:
    """``ckpt`` (a path or ``[A,B,...]``) on ``split`` with ``search``, evaluated once into ``out`` as
    SPLIT_LABEL_beamB_PENALTYA: its scores and its hypotheses' file."""
    name = f"{split}_{label}_beam{search['beam']}_{search['length_penalty']}{search['alpha']:g}"
    record = evaluate_once(ckpt, out, name, [f"split={split}", f"beam={search['beam']}",
                                             f"length_penalty={search['length_penalty']}", f"alpha={search['alpha']}"])
    return {k: record.get(k) for k in REPORTED}, out / f"{name}.hyp"


def ensemble_step(teachers: list[dict], work: Path) -> dict:
    """The teachers' ensemble with their beam and length penalty, its exponent chosen on val among those they tried
    (the first of equals, in the first teacher's order)."""
    searches = {(t["search"]["beam"], t["search"]["length_penalty"]) for t in teachers}
    if len(searches) > 1:
        raise SystemExit(f"the teachers search differently ({sorted(searches)}): one recipe, one search")
    (beam, penalty), = searches
    alphas = list(dict.fromkeys(a for t in teachers for a in t["alphas"]))
    model = model_argument([Path(t["model"]) for t in teachers])
    by_alpha = {a: scored("ensemble", model, "val", {"beam": beam, "length_penalty": penalty, "alpha": a},
                          work / "eval") for a in alphas}
    alpha = max(alphas, key=lambda a: (by_alpha[a][0]["bleu"], -alphas.index(a)))
    return {"step": f"ensemble of the {len(teachers)} teachers", "model": model, "updates": 0,
            "search": {"beam": beam, "length_penalty": penalty, "alpha": alpha}, "val": by_alpha[alpha][0],
            "val_hyp": str(by_alpha[alpha][1]), "val_bleu_by_alpha": {f"{a:g}": s["bleu"] for a, (s, _) in
                                                                     by_alpha.items()}}


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    check_plan(options)
    work, out = Path(options["work"]), Path(options["out"])
    check_work(options, work)
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])

    teachers = [reproduce_run(f"teacher, seed {seed}", f"{options['teacher_prefix']}{seed}",
                              [f"seed={seed}", f"trainer.max_steps={HOUR_UPDATES}"], out)
                for seed in options["teachers"]]
    steps = [*teachers] + ([ensemble_step(teachers, work)] if len(teachers) > 1 else [])
    teacher = steps[-1]  # the ensemble, or the one teacher

    first = Path(teachers[0]["model"])
    data = DataConfig.from_record(read_checkpoint(first, mmap=True)["data_config"], str(first))
    vocabulary = work / "teacher.spm.model"
    save_vocabulary(first, vocabulary)
    distilled = work / "distilled" / "train"
    search = teacher["search"]
    run_step("synthesize", Path(f"{distilled}.json"), [
        "transformer_nmt.synthesize", f"ckpt={teacher['model']}",
        f"input={parallel_files(data.train, data.src_lang, data.tgt_lang)[0]}", f"output={distilled}",
        f"beam={search['beam']}", f"length_penalty={search['length_penalty']}", f"alpha={search['alpha']}"])
    synthesis = json.loads(Path(f"{distilled}.json").read_text(encoding="utf-8"))

    corpus = options["student_corpus"]
    train = distilled if corpus == "distilled" else f"[{data.train},{distilled}]"
    steps.append(reproduce_run(f"student on the {corpus} corpus", f"best_student_{corpus}_{options['student_seed']}",
                               [f"seed={options['student_seed']}", f"trainer.max_steps={options['student_updates']}",
                                "trainer.max_epochs=1000", f"data.train={train}", f"data.tokenizer_path={vocabulary}"],
                               out))

    best = max(steps, key=lambda s: (s["val"]["bleu"], -steps.index(s)))  # the first of equals
    choice, chose = {"model": best["model"], "search": best["search"]}, out / "choice.json"
    if chose.is_file() and json.loads(chose.read_text(encoding="utf-8")) != choice:  # before test or blind sets
        raise SystemExit(f"{chose} records another choice ({chose.read_text(encoding='utf-8').strip()}) than this "
                         f"plan's ({choice}): its test score and blind translations under {options['blind_out']}/"
                         f"best_model/ are the other's; remove them and {chose} first")
    out.mkdir(parents=True, exist_ok=True)
    chose.write_text(json.dumps(choice) + "\n", encoding="utf-8")
    best["test"], test_hyp = scored(best.get("run", "ensemble"), best["model"], "test", best["search"], work / "eval")
    hyps = out / "hyps" / "best_model"
    hyps.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(best["val_hyp"], hyps / f"val.{data.tgt_lang}")
    shutil.copyfile(test_hyp, hyps / f"test.{data.tgt_lang}")
    translate_blind(best["model"], best["search"], Path(options["blind"]),
                    Path(options["blind_out"]) / "best_model", data.tgt_lang)
    result = {"options": options, "hour_updates": HOUR_UPDATES, "training_hours": training_hours(options),
              "steps": steps, "chosen": best["step"], "model": best["model"], "search": best["search"],
              "chosen_on": "val bleu", "synthesis": {"pairs": synthesis.get("pairs"),
                                                        "seconds": sum(x["seconds"] for x in synthesis["launches"])},
              PROVENANCE_KEY: provenance}
    (out / "best_model.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for step in steps:
        print(f"{step['step']}: val BLEU {step['val']['bleu']} ({step['val']['bleu_multi30k']} Multi30k convention)"
              + (f"; test {step['test']['bleu']} ({step['test']['bleu_multi30k']})" if "test" in step else ""))
    print(f"chosen on val: {result['chosen']}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
