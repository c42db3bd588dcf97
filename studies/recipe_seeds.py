"""Seeds of the CPU hour (issue 51): each seed's reproduce run kept as raw files, its chosen model's hypotheses
committed, and the blind test sets translated once with it.

    python -m transformer_nmt.reproduce run_id=seed_S seed=S trainer.max_time=null trainer.max_steps=5194
    python studies/recipe_seeds.py "runs=[outputs/multi30k_cpu_en_de/seed_1234,...]" out=docs/quality/seeds

The recipe's hour is a wall-clock budget (trainer.max_time=55 min), so on a shared host the load decides how many
updates a run gets. The seeds therefore train the updates the hour gave run I on a quiet native-bf16 host (5,194,
``trainer.max_steps``): the load changes how long a seed takes, never what it computes. Everything else is the
recipe's (experiment=multi30k_cpu, its averaging and its choice of checkpoint and length penalty on val).

For each run directory of ``runs`` (a finished ``transformer_nmt.reproduce``), into ``out``:
1. ``NAME_reproduce.json`` and ``NAME_results.json``: the run's reports, as they are (NAME: the run directory's
   name);
2. ``hyps/NAME/{val,test}.TGT``: the hypotheses of the chosen checkpoint with the chosen search (the evaluate
   outputs reproduce scored), copied byte for byte;
3. ``blind_out/NAME/SET.TGT`` (default docs/quality/blind/NAME/): each ``blind`` source (default:
   data/multi30k/blind, English only, references withheld) translated once with the chosen checkpoint and
   search. They are scored elsewhere: nothing here reads a score of them, and nothing is chosen with them.

A step whose output exists is skipped (run again to go on). scripts/docs_tables.py's ``recipe-seeds`` block reads
the reports (mean and sample standard deviation over the seeds).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from transformer_nmt import run_files
from transformer_nmt.inference.translate import main as translate
from transformer_nmt.options import parse_options

OPTIONS = {"runs": [], "out": "docs/quality/seeds", "blind": "data/multi30k/blind", "blind_out": "docs/quality/blind",
           "tgt_lang": "de"}
USAGE = 'python studies/recipe_seeds.py "runs=[RUN_DIR,...]" [out=docs/quality/seeds]'


def chosen_evaluation(report: dict, split: str) -> str:
    """The evaluate name reproduce gave ``split`` scored with the chosen checkpoint and search (its eval/NAME.hyp)."""
    search, stem = report["search"], Path(report["chosen"]).stem
    suffix = f"_{search['length_penalty']}{search['alpha']:g}" if search["beam"] > 1 else ""
    return f"{split}_{stem}_beam{search['beam']}{suffix}"


def chosen_checkpoint(run_dir: Path, chosen: str) -> Path:
    """The file reproduce's ``chosen`` names (a file name: the averaged checkpoint or the last)."""
    files = {run_files.AVERAGED: run_dir / run_files.AVERAGED, run_files.LAST: run_files.last_checkpoint(run_dir)}
    if chosen not in files:
        raise SystemExit(f"{run_dir}/reproduce.json: chosen={chosen!r} is neither of {sorted(files)}")
    return files[chosen]


def keep_reports(run_dir: Path, out: Path, tgt: str, splits: tuple[str, ...] = ("val", "test")) -> dict:
    """Steps 1-2 for one run directory: its reports and its chosen model's hypotheses on each of ``splits``, into
    ``out``; returns the report."""
    name = run_dir.name
    report_file = run_dir / "reproduce.json"
    if not report_file.is_file():
        raise SystemExit(f"{run_dir}: no reproduce.json; run python -m transformer_nmt.reproduce for it first")
    report = json.loads(report_file.read_text(encoding="utf-8"))
    chosen_checkpoint(run_dir, report["chosen"])  # refuses a choice that names neither file
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(report_file, out / f"{name}_reproduce.json")
    shutil.copyfile(run_dir / run_files.RESULTS, out / f"{name}_results.json")
    hyps = out / "hyps" / name
    hyps.mkdir(parents=True, exist_ok=True)
    for split in splits:
        source = run_dir / "eval" / f"{chosen_evaluation(report, split)}.hyp"
        if not source.is_file():
            raise SystemExit(f"{source}: missing; reproduce's evaluation of the chosen model on {split}")
        shutil.copyfile(source, hyps / f"{split}.{tgt}")
    return report


def translate_blind(ckpt: str | Path, search: dict, blind: Path, translations: Path, tgt: str) -> None:
    """Step 3: each blind source translated once with ``ckpt`` (a checkpoint, or ``[A,B,...]``: an ensemble) and
    ``search``, into ``translations``/SET.TGT (a set already there is not translated again)."""
    translations.mkdir(parents=True, exist_ok=True)
    for source in sorted(blind.glob("*.en.gz")):
        output = translations / f"{source.name.removesuffix('.en.gz')}.{tgt}"
        if output.exists():
            print(f"[{translations.name}] {output} done already", flush=True)
            continue
        partial = output.with_suffix(output.suffix + ".partial")
        translate([f"ckpt={ckpt}", f"input={source}", f"output={partial}", f"beam={search['beam']}",
                   f"length_penalty={search['length_penalty']}", f"alpha={search['alpha']}"])
        partial.replace(output)
        print(f"[{translations.name}] {source.name} -> {output}", flush=True)


def keep_run(run_dir: Path, out: Path, tgt: str, blind: Path, blind_out: Path) -> None:
    report = keep_reports(run_dir, out, tgt)
    translate_blind(chosen_checkpoint(run_dir, report["chosen"]), report["search"], blind, blind_out / run_dir.name,
                    tgt)


def main(argv: list[str]) -> None:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["runs"]:
        raise SystemExit(f"runs=[...]: name the reproduce run directories\nusage: {USAGE}")
    for run in options["runs"]:
        keep_run(Path(run), Path(options["out"]), options["tgt_lang"], Path(options["blind"]),
                 Path(options["blind_out"]))


if __name__ == "__main__":
    main(sys.argv[1:])
