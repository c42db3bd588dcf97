"""One model for several languages against one model per pair, at the same total budget in updates, on the bundled
Multi30k (issue 50).

    python studies/multilingual.py experiment=multi30k_tiny "seeds=[1]" steps=8000 out=docs/quality/multilingual.json

1. Three bilingual models, en -> each of ``targets`` (``experiment`` with ``overrides``, data.src_lang=en,
   data.tgt_lang=X), each ``steps`` updates.
2. One one-to-many model over the same pairs (data.pairs=[en-de,en-fr,en-cs], target tags <2de>, ...), as many
   updates as the bilingual models together (``steps`` x the number of targets): the same total budget.
3. One many-to-many model over ``many_langs`` (en, de, fr: every pair with English, both ways), ``steps`` x its
   number of pairs updates; it never sees de -> fr or fr -> de. Under each of ``seeds``, or of
   ``many_to_many_seeds`` where given (the longest run: a second seed for the bilingual comparison alone).
4. Every model's final weights scored per pair on each split of ``splits`` (evaluate: sacreBLEU, and the Multi30k
   convention, lowercased and Moses-tokenized, for each target language alike), beam ``beam``; the many-to-many
   model also on the zero-shot directions between the non-English languages (zero_shot=true), scored against the
   line-aligned references of ``test``, and the same directions pivoted through English (X -> en, then en -> Y,
   both by the many-to-many model).

Every step is skipped when its output exists (a run's results.json, an evaluation's record of the same checkpoint):
run the same command again, or with another seed added, and the study goes on where it stopped. ``models`` (default:
all five) limits what this launch trains and scores, by name ("bilingual en-de", "one-to-many", "many-to-many").
Writes ``out`` (JSON: each run's scores per pair, the zero-shot and pivot scores, the means over seeds, each run's
training wall seconds from its results.json, the provenance); runs and evaluations go under ``work`` (default
outputs/multilingual/, which git ignores). The runs an existing ``out`` records and this launch does not make (a
model left out of ``models``, a seed not given now: a committed file keeps runs whose directories are gone) are
kept in it, when that file's options that shape a run (SHAPING) are this launch's; where they differ,
its runs are dropped, and said so (a launch of some ``models`` refuses instead). Each run records the commit and
time of the launch that recorded it ("made": that launch scored it, or found its evaluations done), and the commit
and torch threads that trained it ("trained", from its results.json). The file's ``options`` are its last launch's;
which seeds each model has, its runs say.
"""

from __future__ import annotations

import json
import sys
from itertools import permutations
from pathlib import Path

from study_steps import SCORES, evaluate_once, mean, parallel_files, reusable, run_step  # studies/: a study's steps

from transformer_nmt.inference.translate import main as translate
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"experiment": "multi30k_tiny", "overrides": [], "seeds": [1], "many_to_many_seeds": None, "steps": 8000,
           "source": "en", "targets": ["de", "fr", "cs"], "many_langs": ["en", "de", "fr"],
           "test": "data/multi30k/test_2016_flickr", "beam": 5, "splits": ["val", "test"],
           "out": "multilingual.json", "work": "outputs/multilingual", "models": None}
USAGE = ("python studies/multilingual.py [experiment=multi30k_tiny] [steps=8000] [seeds=[1]] [models=[NAME,...]] "
         "[out=FILE.json]")
SHAPING = ("experiment", "overrides", "steps", "source", "targets", "many_langs", "test", "beam", "splits")


def pair_scores(ckpt: Path, pairs: list[str], splits: list[str], beam: int, out: Path) -> dict:
    """{pair: {split: evaluate's scores}} of ``ckpt`` on each pair of its own data (``pairs`` None: its one pair)."""
    scores = {}
    for pair in pairs:
        src, tgt = pair.split("-")
        for split in splits:
            result = evaluate_once(ckpt, out, f"{split}.{pair}", [f"split={split}", f"beam={beam}", f"src_lang={src}",
                                                                   f"tgt_lang={tgt}"])
            scores.setdefault(pair, {})[split] = {key: result.get(key) for key in SCORES}
    return scores


def zero_shot_scores(ckpt: Path, options: dict, out: Path) -> dict:
    """{de-fr: {"direct": scores, "pivot": scores}, ...}: the many-to-many model on each direction between two
    non-English languages, directly (zero_shot=true) and through English, against ``test``'s aligned lines."""
    hub, test, beam = options["source"], options["test"], options["beam"]
    rows = {}
    for src, tgt in permutations([lang for lang in options["many_langs"] if lang != hub], 2):
        name = f"{src}-{tgt}"
        source, reference = parallel_files(test, src, tgt)  # PREFIX.SRC / PREFIX.TGT, .gz too
        direct = evaluate_once(ckpt, out, f"{name}.direct", [f"src={source}", f"ref={reference}", f"src_lang={src}",
                                                             f"tgt_lang={tgt}", "zero_shot=true", f"beam={beam}"])
        pivot_text = out / f"{name}.pivot.{hub}"
        pivot_options = [f"src={pivot_text}", f"ref={reference}", f"src_lang={hub}", f"tgt_lang={tgt}", f"beam={beam}"]
        record = out / f"{name}.pivot.json"
        if not (record.exists() and reusable(record, [f"ckpt={ckpt}", *pivot_options])):  # the English again too
            translate([f"ckpt={ckpt}", f"input={source}", f"output={pivot_text}", f"src_lang={src}",
                       f"tgt_lang={hub}", f"beam={beam}"])
        pivot = evaluate_once(ckpt, out, f"{name}.pivot", pivot_options)
        rows[name] = {"direct": {key: direct.get(key) for key in SCORES},
                      "pivot": {key: pivot.get(key) for key in SCORES}}
    return rows


def launch(provenance: dict) -> dict:
    """What a run's "made" records of the launch that recorded it: its commit, whether the tree was dirty, its time."""
    git = provenance.get("git") or {}
    return {"commit": git.get("commit"), "dirty": git.get("dirty"), "time_utc": provenance.get("time_utc")}


def earlier_runs(out: Path, options: dict, models: dict) -> tuple[list[dict], dict]:
    """The runs (each with its "made": the launch that recorded it) and training seconds that ``out`` already
    records, where its options that shape a run are ``options``'; none where it does not exist or they differ (said
    so). A launch of some models only (``models=``) refuses to drop the others' recorded runs."""
    if not out.is_file():
        return [], {}
    try:
        earlier = json.loads(out.read_text(encoding="utf-8"))
        differ = [key for key in SHAPING if earlier["options"].get(key) != options[key]]
        fallback = launch(earlier.get(PROVENANCE_KEY) or {})
        runs = [{**run, "made": run.get("made") or fallback} for run in earlier["runs"]]
        seconds = dict(earlier.get("seconds") or {})
        unknown = [run["model"] for run in runs if run["model"] not in models or not isinstance(run["seed"], int)]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise SystemExit(f"{out}: not a multilingual study's record ({type(error).__name__}: {error}); give another "
                         f"out= or move it away") from None
    if differ and options["models"] is not None:
        raise SystemExit(f"{out}: its {len(runs)} recorded runs were made with other {', '.join(differ)}; a launch of "
                         f"models={options['models']} would drop them: give another out= or launch every model")
    if differ:
        print(f"[{out}] its {len(runs)} recorded runs are not kept: these options differ from this launch's: "
              f"{', '.join(differ)}", flush=True)
        return [], {}
    if unknown:
        raise SystemExit(f"{out}: a recorded run of {unknown[0]!r} (or without an integer seed) is not one of this "
                         f"study's models ({', '.join(models)}); give another out= or move it away")
    return runs, seconds


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    work, hub, steps = Path(options["work"]), options["source"], int(options["steps"])
    one_to_many = [f"{hub}-{tgt}" for tgt in options["targets"]]
    many_to_many = [f"{a}-{b}" for a, b in permutations(options["many_langs"], 2) if hub in (a, b)]
    models = {f"bilingual {pair}": ([pair], [f"data.src_lang={pair.split('-')[0]}",
                                             f"data.tgt_lang={pair.split('-')[1]}"], steps) for pair in one_to_many}
    models["one-to-many"] = (one_to_many, [f"data.pairs=[{','.join(one_to_many)}]"], steps * len(one_to_many))
    models["many-to-many"] = (many_to_many, [f"data.pairs=[{','.join(many_to_many)}]"], steps * len(many_to_many))
    if options["models"] is not None and not isinstance(options["models"], list):
        raise SystemExit(f"models={options['models']}: give a list, models=[many-to-many] or "
                         f"\"models=['bilingual en-de','one-to-many']\"")
    chosen = list(models) if options["models"] is None else list(options["models"])
    unknown = [name for name in chosen if name not in models]
    if unknown:
        raise SystemExit(f"models={options['models']}: no model named {unknown[0]!r}; the study's models: "
                         f"{', '.join(models)}")
    made = launch(provenance)
    recorded, recorded_seconds = earlier_runs(Path(options["out"]), options, models)
    seconds, runs = {}, []
    for name, (pairs, data, updates) in models.items():
        if name not in chosen:
            continue
        seeds = options["seeds"] if name != "many-to-many" or options["many_to_many_seeds"] is None \
            else options["many_to_many_seeds"]
        for seed in seeds:
            run_dir = work / "runs" / name.replace(" ", "_") / f"seed{seed}"
            step = f"{name}, seed {seed}"
            run_step(step, run_dir / "results.json", [
                "transformer_nmt.train", f"experiment={options['experiment']}", *options["overrides"], *data,
                f"trainer.max_steps={updates}", f"seed={seed}", f"name=multilingual_{name.replace(' ', '_')}",
                f"hydra.run.dir={run_dir}"])
            results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
            seconds[step] = results["wall_seconds"]
            trained = {"commit": ((results.get(PROVENANCE_KEY) or {}).get("git") or {}).get("commit"),
                       "torch_threads": results.get("torch_threads")}
            ckpt = run_dir / "checkpoints" / "last.ckpt"
            evaluations = work / "eval" / run_dir.relative_to(work / "runs")
            run = {"model": name, "seed": seed, "pairs": pairs, "updates": updates, "run_dir": str(run_dir),
                   "scores": pair_scores(ckpt, pairs, options["splits"], options["beam"], evaluations)}
            if name == "many-to-many":
                run["zero_shot"] = zero_shot_scores(ckpt, options, evaluations)
            runs.append(run | {"made": made, "trained": trained})
    done = {(run["model"], run["seed"]) for run in runs}
    runs += [run for run in recorded if (run["model"], run["seed"]) not in done]
    order = list(models)
    runs.sort(key=lambda run: (order.index(run["model"]), run["seed"]))
    seconds = {**recorded_seconds, **seconds}  # this launch's over the file's, in the runs' order
    steps_in_order = [f"{run['model']}, seed {run['seed']}" for run in runs]
    seconds = {step: seconds[step] for step in steps_in_order if step in seconds}
    means = {name: {pair: {split: mean([r["scores"][pair][split]["bleu"] for r in runs if r["model"] == name])
                           for split in options["splits"]} for pair in pairs} for name, (pairs, _, _) in models.items()}
    result = {"options": options, "runs": runs, "mean_bleu": means, "seconds": seconds, PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, row in means.items():
        print(f"{name}: " + "; ".join(f"{pair} " + ", ".join(f"{split} BLEU {bleu}" for split, bleu in by.items())
                                      for pair, by in row.items()))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
