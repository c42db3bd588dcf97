"""The Multi30k headline in one command: train a recipe, average, choose on val, score on test.

    python -m transformer_nmt.reproduce [experiment=multi30k_tiny] [run_id=NAME] [alphas=A,B] [KEY=VALUE ...]
    python -m transformer_nmt.reproduce train=false run_id=NAME [KEY=VALUE ...]   # steps 2-4 of a trained run
    python -m transformer_nmt.reproduce train=false run_dir=RUN                   # the same, by its directory
    python -m transformer_nmt.reproduce train=false run_dir=RUN trust_data_paths=true  # a run whose data paths
                                                                                 # are absolute, that you trust
    python -m transformer_nmt.reproduce test=false run_id=NAME [KEY=VALUE ...]    # val only: no test score

(``python -m transformer_nmt.reproduce ...`` is the same command, launched in its checkout.) ``experiment``: the
recipe (default ``multi30k_cpu``, the CPU hour; ``multi30k_tiny``, the published Transformer-Tiny); ``alphas``: the
length penalty's exponents to choose among on val, beside the run's own ``decode.alpha`` (default: the recipe's,
``RECIPE_ALPHAS``: 1.0 and 1.4 for the CPU hour; none for any other run, the faithful Transformer-Tiny included;
``alphas=`` for none); ``test=false``: no score on test at all (neither training's own greedy test,
``run_test=false``, nor step 4's), for a study that reads test once, for the model it chooses among several at its
end; ``select_on``: the registered metric (metrics/) the choices of step 3 are made on (default
``bleu``; ``select_on=comet metric.comet.model=DIR`` chooses on COMET, in its direction; the ``metric.*`` options
go to evaluate as well as to training). Other KEY=VALUE pairs
go to training, after ``experiment=...`` (e.g. ``data.src_lang=de data.tgt_lang=en``). The run directory is the one
``transformer_nmt.train`` picks, ``outputs/NAME_OF_THE_EXPERIMENT/RUN_ID`` (``run_id`` defaults to the launch
time); running again with the same run_id resumes its training (``ckpt_path=auto``). Each step is a separate
process, timed; an evaluate prints one line (its name, BLEU, seconds), its whole record kept in ``RUN/eval/NAME.json``
and its output in ``NAME.log`` beside it:

1. train (data preparation, fit, and the recipe's own greedy test of its best checkpoint);
2. average the checkpoints ``checkpoints/recent`` keeps (the run's ``checkpoint.recent.keep``: step-spaced, or one
   per epoch where the recipe writes one after every validation) into ``averaged.ckpt``;
3. the averaged and the last checkpoint on val with the run's search (its config's ``decode``: beam, length
   penalty and its exponent alpha; DecodeConfig's defaults, the paper's search, for a run older than that node):
   the better val BLEU (``select_on``'s metric) is the chosen checkpoint, then the exponent among ``alphas`` with the
   better val BLEU (the test set is never used for a choice);
4. the chosen checkpoint on test with that search, and greedy (beam 1) on val and on test.

Prints the CPU flags, what the run trained against what it planned ("trained 2,100 of 8,000 planned updates, 34.4
epochs"; ``planned``/``trained`` in reproduce.json), the time of each step, greedy validation BLEU against minutes
since the run's first TensorBoard event file (written as training starts, after data preparation; a resumed run's
minutes include the time between its launches), where the train step's wall time went (training steps, validation,
checkpointing, attention maps, the rest; from the run's results.json, written by time_budget.TimeBudget: a resumed
run's counts only its last launch) with the training steps' model FLOPs utilisation against a matmul ceiling
measured in the training process, and the scores with length ratio and brevity penalty; writes them all to
``RUN/reproduce.json``, with the run directory relative to the launch directory and every other path relative to the
run directory, beside what made it (``provenance``: commit, versions, machine, command line). Each score carries the
conventions others publish: cased and lowercased sacreBLEU and the Multi30k literature's lowercased, Moses-tokenized
BLEU (``bleu_multi30k``, see inference/multi30k_bleu.py).

A run directory given with ``train=false`` may be someone else's (a downloaded run): its files are data. Its
``config.yaml`` is read with ``yaml.safe_load`` (an interpolation is never resolved: no environment variable is read)
and the values used are checked (``check_run_config``); evaluate reads the data paths its checkpoints record only
under evaluate's own rule (relative paths, of a checkpoint inside the launch directory), unless
``trust_data_paths=true`` (the default only with ``train=true``: the run this command trained); a symbolic link at
``RUN/eval`` is refused (``check_real_directory``: evaluate's own refusal does not apply where ``out=`` is named), and
``reproduce.json`` is written atomically (a link there is replaced, never written through). A failed step stops the
command naming it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from transformer_nmt import run_files
from transformer_nmt.durable import atomic_write
from transformer_nmt.hardware import reported_cpu_flags
from transformer_nmt.metrics import catalog
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

# The length penalty's exponents the CPU hour's runs (config name multi30k_cpu_SRC_TGT) try on val beside their own
# (GNMT's alpha): its model chose 1.4 in runs H and I (docs/quality.md). Other runs try only their own unless given
# alphas=: the Transformer-Tiny recipe keeps the published search (its grid on val: docs/quality.md, "The published
# baseline").
RECIPE_ALPHAS = {"multi30k_cpu_": "1.0,1.4"}  # beside the run's own decode.alpha (the paper's), always tried first
SCORE_KEYS = ("bleu", "bleu_lowercase", "bleu_multi30k", "chrf", "length_ratio", "bp")  # evaluate's, per score


def relative_path(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` where it lies below it (as the run directory lies below the launch directory),
    else as given: reproduce.json names no directory of the machine that wrote it."""
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def relative_strings(node, root: Path):
    """``node`` (a plain config: dicts, lists, scalars) with every string that is a path below ``root`` made relative
    to it (``relative_path``): the run's config names its directories absolutely (``hydra.run.dir`` is given so),
    and reproduce.json names no directory of the machine that wrote it."""
    if isinstance(node, dict):
        return {key: relative_strings(value, root) for key, value in node.items()}
    if isinstance(node, list):
        return [relative_strings(value, root) for value in node]
    if isinstance(node, str) and node.startswith(str(Path(root).resolve()) + "/"):
        return relative_path(Path(node), root)
    return node


def run_step(name: str, args: list[str], timings: dict, root: Path, log: Path | None = None) -> float:
    """Run ``python -m ARGS`` in ``root`` (the launch directory, whose data/ the recipe reads), fail loudly,
    record its wall time in minutes; returns it in seconds. With ``log``, the step's standard output goes to that
    file instead of the terminal (an evaluate's whole record: its NAME.json holds it too), and nothing is printed
    here: the caller prints the step's one line."""
    if log is None:
        print(f"\n=== {name}: {' '.join(args)}", flush=True)
    started = time.perf_counter()
    if log is None:  # its messages on the terminal
        completed = subprocess.run([sys.executable, "-m", *args], cwd=root)
        if completed.returncode != 0:
            sys.exit(f"{name} failed (exit status {completed.returncode}; its message is above): {' '.join(args)}")
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w", encoding="utf-8") as out:
            done = subprocess.run([sys.executable, "-m", *args], cwd=root, stdout=out)
        if done.returncode != 0:
            sys.exit(f"{name} failed (exit status {done.returncode}): python -m {' '.join(args)}; its output: {log}")
    seconds = time.perf_counter() - started
    timings[name] = round(seconds / 60, 2)
    return seconds


PHASE_LABELS = {  # results.json's time_budget phases (transformer_nmt/time_budget.py), in the order shown
    "training_steps": "training steps (forward, loss, backward, optimizer)",
    "validation": "validation (greedy decoding for val BLEU, loss)",
    "checkpointing": "checkpointing (writing files)",
    "attention_maps": "attention maps (probe forward passes, waits for renders)",
    "mfu_probe": "matmul ceiling probe (MFU)",
    "fit_other": "rest of fit (fetching batches, logging, callbacks)",
    "test": "test (the recipe's greedy test of its best checkpoint)",
    "outside_phases": "rest outside fit (start-up, imports, data preparation, loading for test)",
}


def where_the_time_went(results: dict, train_seconds: float | None) -> dict | None:
    """The training step's wall time by phase, from the run's results.json (its ``time_budget``): seconds and
    share of ``train_seconds`` (the train step's wall time, as this script timed it; None: the run's own
    ``wall_seconds``, which leaves out interpreter start-up), with whatever no phase holds as
    ``outside_phases``; and the training step's model FLOPs utilisation. None where results.json has no
    time budget (a run older than it)."""
    budget = results.get("time_budget")
    if not budget:
        return None
    wall = train_seconds or budget.get("wall_seconds") or results["wall_seconds"]
    seconds = dict(budget["seconds"])
    seconds["outside_phases"] = max(wall - sum(seconds.values()), 0.0)
    return {"wall_seconds": round(wall, 2), "of": "train step" if train_seconds else "train() call",
            "phases": {phase: {"seconds": round(seconds[phase], 1), "share": round(seconds[phase] / wall, 4)}
                       for phase in PHASE_LABELS if phase in seconds},
            "mfu": budget.get("mfu"), "view": budget.get("rank")}


def print_time_budget(budget: dict, precision: str | None) -> None:
    print(f"\n| where the train step's {budget['wall_seconds'] / 60:.1f} minutes went | seconds | share |")
    print("| --- | --- | --- |")
    for phase, entry in budget["phases"].items():
        print(f"| {PHASE_LABELS[phase]} | {entry['seconds']:,.1f} | {100 * entry['share']:.1f}% |")
    mfu = budget["mfu"]
    if mfu and mfu.get("ceiling"):
        ceiling = mfu["ceiling"]
        shapes = ", ".join(f"{name} {rate:,.0f}" for name, rate in ceiling["gflops"].items())
        over_fit = "-" if mfu.get("achieved_gflops_over_fit") is None else f"{mfu['achieved_gflops_over_fit']:,.1f}"
        print(f"\nMFU of the training steps ({precision}, {ceiling['threads']} thread(s)): "
              f"{mfu['achieved_gflops']:,.1f} model GFLOP/s against a {ceiling['dtype']} matmul ceiling of "
              f"{ceiling['ceiling_gflops']:,.0f} GFLOP/s ({shapes} at {ceiling['tokens']} rows) = "
              f"{100 * mfu['share_of_ceiling']:.1f}%; over the whole fit {over_fit} GFLOP/s")


def run_directory(train_overrides: list[str], root: Path) -> Path:
    """The directory ``python -m transformer_nmt.train *train_overrides`` launched in ``root`` runs in (its
    ``hydra.run.dir``)."""
    from hydra import compose, initialize_config_dir

    from transformer_nmt.conf import CONF_DIR
    from transformer_nmt.training.config import register_configs
    from transformer_nmt.training.resolvers import register_resolvers

    register_configs()  # conf/train.yaml composes over the schemas
    register_resolvers()  # hydra.run.dir: ${run_name:}
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=train_overrides, return_hydra_config=True)
    return root / cfg.hydra.run.dir


def choose(candidates: dict, metric: str):
    """The key of ``candidates`` ({key: evaluate's record}) whose ``metric`` is best in its direction (a registered
    metric's: higher BLEU, lower TER); of equals, the first (catalog.best, as the studies choose)."""
    return catalog.best(list(candidates), lambda key: candidates[key][metric], metric, "select_on")


def evaluate(ckpt: Path, split: str, search: dict, out: Path, timings: dict, root: Path,
             trust_data_paths: bool = False, extra: list[str] = ()) -> dict:
    """``ckpt`` on ``split`` with ``search`` (beam, length_penalty, alpha), through ``transformer_nmt.evaluate``;
    ``trust_data_paths``: evaluate reads the data paths the checkpoint records wherever they lead (only for the run
    this command trained; else evaluate's own rule decides: relative paths, of a checkpoint inside the launch
    directory); ``extra``: more of its options (the metrics to compute and their settings)."""
    beam = search["beam"]
    name = f"{split}_{ckpt.stem}_beam{beam}" + (f"_{search['length_penalty']}{search['alpha']:g}" if beam > 1 else "")
    seconds = run_step(f"evaluate {name}", ["transformer_nmt.evaluate", f"ckpt={ckpt}", f"split={split}",
                                            f"beam={beam}", f"trust_data_paths={str(trust_data_paths).lower()}",
                                            f"length_penalty={search['length_penalty']}", f"alpha={search['alpha']}",
                                            f"out={out}", f"name={name}", *extra], timings, root,
                       log=out / f"{name}.log")
    record = json.loads((out / f"{name}.json").read_text())
    bleu = f"BLEU {record['bleu']:.2f}, " if isinstance(record.get("bleu"), (int, float)) else ""
    print(f"evaluate {name}: {bleu}{seconds:.0f} s (record: {out / name}.json)", flush=True)
    return record


def run_search(run_config, alphas: str | None) -> tuple[dict, list[float]]:
    """The run's search (its config's ``decode``: beam, length_penalty, alpha; DecodeConfig's defaults for a run
    older than that node) and the length-penalty exponents to choose among on val (``alphas=A,B,...``; None or
    empty: the run's alone)."""
    from transformer_nmt.generation.config import DecodeConfig

    default = DecodeConfig()
    decode = run_config.get("decode") or {}
    search = {"beam": int(decode.get("beam", default.beam)),
              "length_penalty": str(decode.get("length_penalty", default.length_penalty)),
              "alpha": float(decode.get("alpha", default.alpha))}
    if not alphas:
        return search, [search["alpha"]]
    try:
        values = [float(a) for a in alphas.strip("[]").split(",") if a.strip()]
    except ValueError:
        values = []
    if not values:
        sys.exit(f"alphas={alphas!r}: give numbers, alphas=0.8,1.0,1.2")
    return search, values


# What a recipe's reference run trained in its hour, by (the run's config name, precision): the target a run of the
# same recipe on another host is said against ("0.64x the 5,194 updates of the reference run"). The hour is a budget
# of time, not of updates: the schedule does not depend on the run's length (a time limit truncates it cleanly), and
# the reference run's model is near a plateau but still improving at its end, so a faster host keeps its extra
# updates; a slower one's shortfall is printed and recorded. ``raw``: the run's reports under docs/quality/
# (RAW_results.json, RAW_reproduce.json; a test holds these numbers to them). bf16: run I, the hour itself. fp32:
# the hour of an AVX2-only host (issue 51's run on a 2-core AMD EPYC: 5,880 updates, transcribed in
# docs/quality/avx2/issue51_amd_hour.json), whose own files are not here, so the reference is those updates
# trained in full with the kernels held to AVX2 (``updates_of``: where its update count comes from, printed).
# A run is said against it only where it ran the reference's time limit and model (its architecture: every field of
# results.json's ``model`` but the attention kernel's); another limit or model under the recipe's name has no target.
RECIPE_MODEL = {"vocab_size": 8000, "d_model": 256, "n_heads": 4, "d_k": None, "d_v": None, "n_encoder_layers": 3,
                "n_decoder_layers": 3, "d_ff": 1024, "attention_dropout": 0.0, "activation_dropout": 0.0,
                "max_positions": 512, "positions": "rotary", "norm_first": False, "norm": "layernorm",
                "tie_embeddings": True, "activation": "relu", "output_bias": False, "pad_id": 0}
REFERENCE_HOURS = {
    ("multi30k_cpu_en_de", "bf16-mixed"): {"run": "I", "raw": "run_I", "steps": 5194, "epochs": 42.23,
                                           "max_time": "00:00:55:00", "model": {**RECIPE_MODEL, "dropout": 0.3}},
    ("multi30k_cpu_en_de", "32-true"): {"run": "avx2_sim", "raw": "avx2/avx2_sim", "steps": 5880, "epochs": 11.95,
                                        "max_time": "00:00:55:00", "model": {**RECIPE_MODEL, "dropout": 0.1},
                                        "updates_of": "issue 51's AVX2-only hour"}}


def recipe_alphas(run_config) -> str | None:
    """The exponents a run of a recipe in RECIPE_ALPHAS tries by default (by its config's name), else None."""
    name = str(run_config.get("name") or "")
    return next((alphas for prefix, alphas in RECIPE_ALPHAS.items() if name.startswith(prefix)), None)


def planned_and_trained(results: dict, run_config) -> dict:
    """What the run was planned to train (max_steps, max_epochs, max_time) against what it trained (steps, epochs),
    so that a slow host reads "trained 2,100 of 3,500 planned updates" rather than a silent shortfall; for a recipe
    run with a time limit and a reference run of its name and precision (REFERENCE_HOURS), that run's updates as
    the target."""
    trainer = run_config.get("trainer") or {}
    planned = {"max_steps": trainer.get("max_steps"), "max_epochs": trainer.get("max_epochs"),
               "max_time": trainer.get("max_time")}
    trained = {"steps": results.get("steps"), "epochs": results.get("epochs")}
    key = (run_config.get("name"), results.get("precision"))
    reference = REFERENCE_HOURS.get(key) if planned["max_time"] else None
    model = results.get("model") if isinstance(results.get("model"), dict) else {}
    if reference and (planned["max_time"] != reference["max_time"]
                      or any(model.get(field, "absent") != value for field, value in reference["model"].items())):
        reference = None  # the recipe's name, but another time limit or model: not the reference's hour
    shown = {k: v for k, v in reference.items() if k in ("run", "steps", "epochs", "updates_of")} if reference else None
    return {"planned": planned, "trained": trained, **({"reference": shown} if shown else {})}


def describe_budget(budget: dict) -> str:
    planned, trained = budget["planned"], budget["trained"]
    parts = []
    if planned.get("max_steps") not in (None, -1) and trained.get("steps") is not None:
        parts.append(f"trained {trained['steps']:,} of {planned['max_steps']:,} planned updates")
    elif trained.get("steps") is not None:
        parts.append(f"trained {trained['steps']:,} updates")
    if trained.get("epochs") is not None:
        parts.append(f"{trained['epochs']} epochs" + (f" (at most {planned['max_epochs']})"
                                                     if planned.get("max_epochs") not in (None, -1) else ""))
    if planned.get("max_time"):
        parts.append(f"time limit {planned['max_time']}")
    reference = budget.get("reference")
    if reference and trained.get("steps") is not None:
        parts.append(f"{trained['steps'] / reference['steps']:.2f}x the {reference['steps']:,} updates "
                     f"({reference['epochs']} epochs) of the recipe's reference run {reference['run']} "
                     + (f"(docs/quality.md; its updates: {reference['updates_of']})" if reference.get("updates_of")
                        else "(docs/quality.md)"))
    return ", ".join(parts)


LIMIT = re.compile(r"\d+:\d\d:\d\d:\d\d")  # Lightning's DD:HH:MM:SS


def read_run_config(path: Path) -> dict:
    """The run's config.yaml as plain data (``yaml.safe_load``: an interpolation such as ``${oc.env:VAR}`` stays
    the text it is, never resolved; the run writes its config resolved, so its own has none), with the values this
    command uses checked (``check_run_config``): a run directory may be someone else's. SystemExit naming the file
    and the key otherwise."""
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        sys.exit(f"{path}: cannot be read as the run's config ({str(error).splitlines()[0][:200]})")
    if not isinstance(config, dict):
        sys.exit(f"{path}: holds no config mapping")
    check_run_config(config, path)
    return config


def check_run_config(config: dict, path: Path) -> None:
    """SystemExit naming ``path`` and the key where a value this command reads, copies into reproduce.json or passes
    on to average and evaluate is not of its kind: ``trainer.max_steps``/``max_epochs`` integers or null,
    ``trainer.max_time`` null, DD:HH:MM:SS or a mapping of numbers, ``checkpoint.recent.keep`` a whole number >= 0,
    ``decode.beam`` a positive integer, ``decode.length_penalty`` one of the search's, ``decode.alpha`` a number,
    ``name`` a string or null."""
    from transformer_nmt.generation.search import LENGTH_PENALTIES

    def value(dotted: str):
        node = config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def integer(v, least=None):
        return isinstance(v, int) and not isinstance(v, bool) and (least is None or v >= least)

    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    checks = {
        "trainer.max_steps": lambda v: v is None or integer(v),
        "trainer.max_epochs": lambda v: v is None or integer(v),
        "trainer.max_time": lambda v: v is None or (isinstance(v, str) and LIMIT.fullmatch(v)) or (
            isinstance(v, dict) and all(isinstance(k, str) and number(x) for k, x in v.items())),
        "checkpoint.recent.keep": lambda v: integer(v, 0),  # 0: the run kept none (refused below, saying so)
        "decode.beam": lambda v: v is None or integer(v, 1),
        "decode.length_penalty": lambda v: v is None or v in LENGTH_PENALTIES,
        "decode.alpha": lambda v: v is None or number(v),
        "name": lambda v: v is None or isinstance(v, str),
    }
    for key, valid in checks.items():
        if not valid(value(key)):
            sys.exit(f"{path}: {key}={value(key)!r:.80} is not a value a run writes there: the run directory is "
                     f"damaged or not a transformer_nmt run's")


def check_real_directory(path: Path) -> Path:
    """``path`` (where this command has evaluate write) unless it is a symbolic link: evaluate writes beside the
    checkpoints only into a real directory (evaluate.default_out_dir), and this command names ``out=`` for it, so
    it refuses a planted link itself. SystemExit naming the link."""
    if path.is_symlink():
        sys.exit(f"{path} is a symbolic link (to {os.readlink(path)}): reproduce writes its evaluations only into a "
                 f"real directory; remove the link")
    return path


def validation_curve(run_dir: Path) -> list[tuple[float, int, float]]:
    """(minutes since the first event file's creation, optimizer step, greedy val BLEU) of every validation,
    from the run's TensorBoard events (files named events.out.tfevents.SECONDS.HOST...)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted((run_dir / run_files.TENSORBOARD).rglob("events.out.tfevents.*"))
    if not files:
        return []
    launched = min(int(f.name.split(".")[3]) for f in files)
    curve = []
    for events in files:
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if "val/bleu" in accumulator.Tags()["scalars"]:
            curve += [(round((e.wall_time - launched) / 60, 1), e.step, round(e.value, 2))
                      for e in accumulator.Scalars("val/bleu")]
    return sorted(curve)


def scalar_curve(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(optimizer step, value) of every event of the scalar ``tag`` (``val/loss``, ...) in the run's TensorBoard
    events, in step order; a step logged twice (a resumed run) keeps its later value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, tuple[float, float]] = {}
    for events in sorted((run_dir / run_files.TENSORBOARD).rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            for e in accumulator.Scalars(tag):
                if e.step not in values or e.wall_time >= values[e.step][0]:
                    values[e.step] = (e.wall_time, round(e.value, 4))
    return [(step, value) for step, (_, value) in sorted(values.items())]


def main(argv: list[str], root: Path | None = None) -> dict:
    """The command line of transformer_nmt.reproduce, launched in ``root`` (default: the current directory;
    the script passes its checkout)."""
    root = Path.cwd() if root is None else root
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        sys.exit(0)
    flags = [arg for arg in argv if arg.startswith("-")]
    if flags:
        sys.exit(f"transformer_nmt.reproduce takes KEY=VALUE options (see --help), not {flags[0]}")
    provenance = collect_provenance()  # the load at the start; its config: the run's, once trained
    own = {"run_dir": None, "train": "true", "test": "true", "experiment": "multi30k_cpu", "alphas": None,
           "trust_data_paths": None, "select_on": "bleu"}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in own:
            own[key] = value
    for key in ("train", "test"):
        if own[key] not in ("true", "false"):
            sys.exit(f"{key}={own[key]!r}: use true or false")
    # the data paths a checkpoint records are trusted for the run this command trains; for a run directory given
    # with train=false, evaluate's own rule decides (trust_data_paths=true: the user vouches for the run)
    trust = own["trust_data_paths"] or own["train"]
    if trust not in ("true", "false"):
        sys.exit(f"trust_data_paths={own['trust_data_paths']!r}: use true or false")
    select_on = own["select_on"]
    try:
        catalog.metric_class(select_on, "select_on")
    except ValueError as error:
        sys.exit(str(error))
    from transformer_nmt.training.run_dir import run_name
    overrides = [a for a in argv if a.partition("=")[0] not in own]
    if not any(a.startswith("run_id=") for a in overrides):
        overrides.append(f"run_id={run_name(None)}")  # fixed here, so that this script knows the run dir
    if own["test"] == "false":
        overrides.append("run_test=false")  # training's own test of its best checkpoint, after fit
    train_overrides = [f"experiment={own['experiment']}", *overrides]
    run_dir = Path(own["run_dir"]).resolve() if own["run_dir"] else run_directory(train_overrides, root)
    eval_dir = run_dir / run_files.EVAL
    timings: dict[str, float] = {}
    # evaluate's own metrics, and select_on's where it is not one of them; the metrics' settings (metric.comet.model)
    from transformer_nmt.inference.evaluate import REPORTED

    reported = REPORTED + ([select_on] if select_on not in REPORTED else [])
    extra = [f"metrics=[{','.join(reported)}]"] + [a for a in overrides if a.startswith("metric.")]

    train_seconds = None
    if own["train"] == "true":
        train_seconds = run_step("train", ["transformer_nmt.train", *train_overrides, f"hydra.run.dir={run_dir}"],
                                 timings, root)
    elif not run_files.last_checkpoint(run_dir).is_file():
        sys.exit(f"train=false: {run_files.last_checkpoint(run_dir)} does not exist; give the run_id "
                 f"(and overrides) or run_dir of a trained run")
    check_real_directory(eval_dir)  # out= is named for evaluate, whose own refusal of a linked eval/ is skipped
    run_config = read_run_config(run_dir / run_files.CONFIG)  # as data: nothing resolved, values checked
    provenance["config"] = relative_strings(run_config, root)
    keep = run_config["checkpoint"]["recent"]["keep"]
    if keep < 1:
        sys.exit(f"{run_dir}: the run kept no recent checkpoints (checkpoint.recent.keep=0), so there is nothing to "
                 f"average; train it with checkpoint.recent.keep=K (the recipe keeps 10)")
    search, alphas = run_search(run_config, recipe_alphas(run_config) if own["alphas"] is None else own["alphas"])
    beam = search["beam"]
    averaged, last = run_dir / run_files.AVERAGED, run_files.last_checkpoint(run_dir)
    recent = run_dir / run_files.CHECKPOINTS / run_files.RECENT
    run_step("average", ["transformer_nmt.average", f"dir={recent}", f"last={keep}", f"output={averaged}"], timings,
             root)
    val = {ckpt.stem: evaluate(ckpt, "val", search, eval_dir, timings, root, trust == "true", extra)
           for ckpt in (averaged, last)}
    chosen = {c.stem: c for c in (averaged, last)}[choose(val, select_on)]  # ties: the averaged one (first)
    # The length penalty's exponent, chosen on val among alphas= (the run's own first: ties keep it)
    by_alpha = {search["alpha"]: val[chosen.stem]}
    for alpha in alphas:
        if alpha not in by_alpha:
            by_alpha[alpha] = evaluate(chosen, "val", {**search, "alpha": alpha}, eval_dir, timings, root,
                                       trust == "true", extra)
    chosen_alpha = choose(by_alpha, select_on)
    chosen_search = {**search, "alpha": chosen_alpha}
    greedy = {**search, "beam": 1}
    scores = {("val", beam): by_alpha[chosen_alpha]}
    for split, split_search in (("test", chosen_search), ("val", greedy), ("test", greedy)):
        if split == "val" or own["test"] == "true":
            scores[(split, split_search["beam"])] = evaluate(chosen, split, split_search, eval_dir, timings, root,
                                                             trust == "true", extra)
    curve = validation_curve(run_dir)
    results_file = run_dir / run_files.RESULTS
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    results = results if isinstance(results, dict) else {}
    budget = where_the_time_went(results, train_seconds) if results else None
    length = planned_and_trained(results, run_config)
    report = {
        "run_dir": relative_path(run_dir, root), "experiment": own["experiment"], "overrides": overrides,
        "cpu_flags": reported_cpu_flags(), **length,
        "search": chosen_search, "val_bleu_by_alpha": {f"{a:g}": by_alpha[a]["bleu"] for a in by_alpha},
        "train_minutes": timings.get("train"), "total_minutes": round(sum(timings.values()), 2), "timings": timings,
        "val_bleu_chosen_on": {stem: s["bleu"] for stem, s in val.items()}, "chosen": chosen.name,
        "select_on": select_on, "val_chosen_on": {stem: s[select_on] for stem, s in val.items()},
        "scores": {f"{split}_beam{width}": {k: s.get(k) for k in (*SCORE_KEYS, select_on)}
                   for (split, width), s in scores.items()},
        **scores_by_pair(scores, select_on),
        "val_curve": [{"minutes": m, "step": step, "greedy_val_bleu": b} for m, step, b in curve],
        "val_loss_curve": [{"step": step, "val_loss": loss} for step, loss in scalar_curve(run_dir, "val/loss")],
        "precision": results.get("precision"), "torch_threads": results.get("torch_threads"),
        "time_budget": budget,
        PROVENANCE_KEY: relative_strings(provenance, root),  # python -m records its module's absolute path
    }
    text = json.dumps(report, indent=2) + "\n"  # atomically: a link planted there is replaced, never written through
    atomic_write(run_dir / "reproduce.json", lambda f: f.write(text.encode("utf-8")))

    print(f"\nCPU flags: {' '.join(report['cpu_flags'])}; run dir {run_dir}")
    print(f"length: {describe_budget(length)}")
    print("\n| step | minutes |\n| --- | --- |")
    for name, minutes in timings.items():
        print(f"| {name} | {minutes} |")
    if budget:
        print_time_budget(budget, results.get("precision"))
    print("\n| minutes | step | greedy val BLEU |\n| --- | --- | --- |")
    for minutes, step, bleu in curve:
        print(f"| {minutes} | {step} | {bleu} |")
    label = "BLEU" if select_on == "bleu" else select_on
    print(f"\nval {label}, beam {beam} ({search['length_penalty']} length penalty, alpha {search['alpha']:g}): "
          f"averaged {val['averaged'][select_on]}, last {val['last'][select_on]} -> chosen {chosen.name}")
    if len(by_alpha) > 1:
        print(f"val {label} by alpha: " + ", ".join(f"{a:g} {r[select_on]}" for a, r in by_alpha.items())
              + f" -> alpha {chosen_alpha:g}")
    by_pair = report.get("scores_by_pair")
    print_scores(scores, "" if not by_pair else " (mean over the pairs)")
    for pair, pair_scores in (by_pair or {}).items():
        print_scores({tuple(key.split("_beam")): row for key, row in pair_scores.items()}, f" ({pair})")
    return report


def scores_by_pair(scores: dict, select_on: str) -> dict:
    """``{"scores_by_pair": {pair: {SPLIT_beamN: its scores}}}`` where the model has several pairs (evaluate's record
    then holds each under ``pairs``, and its own scores are their means); {} for one pair."""
    if not scores or not all(isinstance(s.get("pairs"), dict) for s in scores.values()):
        return {}
    pairs = list(next(iter(scores.values()))["pairs"])
    return {"scores_by_pair": {pair: {f"{split}_beam{width}": {k: s["pairs"].get(pair, {}).get(k)
                                                                for k in (*SCORE_KEYS, select_on)}
                                      for (split, width), s in scores.items()} for pair in pairs}}


def print_scores(scores: dict, title: str = "") -> None:
    """The scores' table, one row per (split, beam width); ``title``: after the header's first cell."""
    def shown(value, digits=2):
        return "-" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"

    print(f"\n| split{title} | decoder | BLEU | BLEU lowercased | BLEU Multi30k (lc, Moses-tok) | chrF | length ratio "
          f"| BP |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (split, width), s in scores.items():
        decoder = "greedy" if int(width) == 1 else f"beam {width}"
        print(f"| {split} | {decoder} | {shown(s.get('bleu'))} | {shown(s.get('bleu_lowercase'))} | "
              f"{shown(s.get('bleu_multi30k'))} | {shown(s.get('chrf'))} | {shown(s.get('length_ratio'), 3)} | "
              f"{shown(s.get('bp'), 3)} |")
