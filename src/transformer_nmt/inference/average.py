"""Checkpoint averaging (paper section 6.1: the base models average the last 5 checkpoints).

    python -m transformer_nmt.average dir=RUN_DIR/checkpoints/recent last=5 output=RUN_DIR/averaged.ckpt
    python -m transformer_nmt.average 'inputs=[a.ckpt,b.ckpt]' output=averaged.ckpt

"Last" means the highest training steps, read from the checkpoints themselves. The output holds the
element-wise mean of the model weights with the model config and tokenizer of the newest input, and
loads wherever a training checkpoint does (``evaluate``, ``translate``); it carries no optimizer state,
so training does not resume from it, and it records that it is an average (``averaged_from``: its inputs).

The inputs must be one training run: the same run identity (a training run keeps one from its fresh start
through every resume; for checkpoints written before runs recorded one: the same run fingerprint, the settings
that define the run, and the same model config). ``dir=`` checks every checkpoint of the directory, so that the
files an older run left there (a restart with ``ckpt_path=null`` in the same run dir keeps them) are never
averaged in, or averaged instead of the new run's. ``allow_mixed=true`` averages checkpoints of different runs
anyway (seeds, say); a different vocabulary is refused even then (the ids of one would mean other pieces in the
other), and so is another translation direction (``data.src_lang``/``data.tgt_lang``, checkpoint.LANGUAGE_FIELDS: an
en->de and a de->en model may share one vocabulary). Each input is checked as ``load_checkpoint`` checks it before
anything is summed (checkpoint.model_config_of: sizes within MODEL_LIMITS, the weights it describes held in the file;
checkpoint.check_stored_sizes in every read: no view that repeats stored values), so the float64 sum is bounded by
what the files hold. An average is never an input: the ``output`` is left out of the ``dir=`` window, and a
checkpoint that is an average is refused. The ``output`` never replaces what a run needs: ``last.ckpt`` (what a
run resumes from) is refused as an output, and so is an existing file that is not an earlier average (a training
checkpoint, one holding optimizer state above all, or a file that is no checkpoint).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import List, Optional

import torch

from transformer_nmt import run_files
from transformer_nmt.checkpoint import (
    CKPT_DATA_CONFIG,
    CKPT_FINGERPRINT,
    CKPT_MODEL_CONFIG,
    CKPT_RUN,
    CheckpointError,
    atomic_torch_save,
    describe_languages,
    model_config_of,
    read_checkpoint,
    translation_languages,
    vocabulary_entries,
)
from transformer_nmt.model.transformer import TransformerConfig
from transformer_nmt.options import Role, command_argv, option, parse_options

AVERAGED_FROM = "averaged_from"  # the key an averaged checkpoint records its inputs under
MIXED_FIX = ("average the checkpoints of one run (move the other run's files out of the directory, or list the "
             "checkpoints with inputs=[...]), or pass allow_mixed=true to average them anyway")


def _differences(first: dict, other: dict) -> str:
    keys = sorted(k for k in first.keys() | other.keys() if first.get(k, "absent") != other.get(k, "absent"))
    shown = ", ".join(f"{k}: {first.get(k, 'absent')!r:.40} / {other.get(k, 'absent')!r:.40}" for k in keys[:6])
    return shown + (f", and {len(keys) - 6} more" if len(keys) > 6 else "")


# Model config fields that choose how the same arithmetic is computed, not the weights: those whose role is
# Role.MAY_CHANGE (a run may resume under another attention kernel)
SAME_ARITHMETIC = tuple(f.name for f in fields(TransformerConfig) if f.metadata["role"] is Role.MAY_CHANGE)


def _groups(checkpoints: dict[Path, dict], value) -> list[tuple[object, list[Path]]]:
    """[(value, paths)] of the checkpoints that record ``value(checkpoint)`` (not None), in first-seen order."""
    groups: list[tuple[object, list[Path]]] = []
    for path, checkpoint in checkpoints.items():
        found = value(checkpoint)
        if found is None:
            continue
        group = next((g for g in groups if g[0] == found), None)
        if group is None:
            groups.append((found, [path]))
        else:
            group[1].append(path)
    return groups


def _model_config(checkpoint: dict) -> dict | None:
    config = checkpoint.get(CKPT_MODEL_CONFIG)
    return {k: v for k, v in config.items() if k not in SAME_ARITHMETIC} if isinstance(config, dict) else None


def check_one_run(checkpoints: dict[Path, dict], allow_mixed: bool = False) -> None:
    """Refuse (``CheckpointError``) ``checkpoints`` ({path: checkpoint}) that are averages, that hold different
    vocabularies, or, unless ``allow_mixed``, that come from different training runs. One run: one run identity
    (``CKPT_RUN``: from a fresh start through every resume). Where some checkpoint records none (written before
    it existed), the settings are compared instead: the run fingerprint and the model config (but for the
    attention kernel), among the checkpoints that record them."""
    for path, checkpoint in checkpoints.items():
        if AVERAGED_FROM in checkpoint:
            raise CheckpointError(f"checkpoint {path} is an average (of {len(checkpoint[AVERAGED_FROM])} checkpoints) "
                                  f"written by transformer_nmt.average: averaging it again would weigh its inputs "
                                  f"twice; average the training checkpoints themselves")
    checks = [("vocabularies (SentencePiece models and joint pieces)", vocabulary_entries, None),
              ("translation directions", lambda c: translation_languages(c.get(CKPT_DATA_CONFIG)),
               lambda a, b: f"{describe_languages(a)} / {describe_languages(b)}"),
              ("training runs", lambda c: c.get(CKPT_RUN), lambda a, b: f"run {a} / run {b}")]
    if any(checkpoint.get(CKPT_RUN) is None for checkpoint in checkpoints.values()):
        checks += [("runs with other settings (run fingerprints)", lambda c: c.get(CKPT_FINGERPRINT), _differences),
                   ("model configs", _model_config, _differences)]
    for what, value, explain in checks:
        groups = _groups(checkpoints, value)
        vocabulary, direction = explain is None, what == "translation directions"
        if len(groups) < 2 or (allow_mixed and not (vocabulary or direction)):
            continue
        listed = "; ".join(", ".join(p.name for p in paths) for _, paths in groups)
        detail = f" ({explain(groups[0][0], groups[1][0])})" if explain else ""
        fix = MIXED_FIX if not (vocabulary or direction) else (
            "the ids of one would mean other pieces in the other: average checkpoints of one run (allow_mixed=true "
            "does not apply)" if vocabulary else "their mean translates in neither direction: average checkpoints "
            "of one direction (allow_mixed=true does not apply)")
        raise CheckpointError(f"the checkpoints come from {len(groups)} different {what}{detail}: {listed} "
                              f"(in {groups[0][1][0].parent}); {fix}")


def average_checkpoints(paths: list[str | Path], allow_mixed: bool = False) -> dict:
    """Average the model weights of ``paths`` (a list of training checkpoints of one run, ``check_one_run``)
    into one checkpoint dict.

    Checkpoints are memory-mapped and summed one at a time: memory holds one float64 copy of the
    weights, never the inputs' optimizer states.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    headers = {p: read_checkpoint(p, mmap=True) for p in paths}
    check_one_run(headers, allow_mixed)
    for path, header in headers.items():  # what load_checkpoint checks: sizes within MODEL_LIMITS, weights held
        model_config_of(header, f"checkpoint {path}")
    newest = max(headers.values(), key=lambda c: c.get("global_step") or 0)
    reference = newest["state_dict"]
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in reference.items() if v.is_floating_point()}
    for path in paths:
        weights = headers[path]["state_dict"]
        if weights.keys() != reference.keys() or any(weights[k].shape != v.shape for k, v in reference.items()):
            raise CheckpointError(f"checkpoint {path} has other parameters than the newest input: "
                                  f"only checkpoints of one model can be averaged")
        for key, value in total.items():
            value += weights[key]
    averaged = {key: (total[key] / len(paths)).to(value.dtype) if key in total
                else value.clone()  # integer buffers (counters): keep the newest
                for key, value in reference.items()}
    kept = {k: v for k, v in newest.items() if k not in ("state_dict", "optimizer_states", "lr_schedulers", "loops",
                                                         "callbacks")}
    return {**kept, "state_dict": averaged, AVERAGED_FROM: [str(p) for p in paths]}


def last_checkpoints(directory: str | Path, n: int, exclude: str | Path | None = None,
                     allow_mixed: bool = False) -> list[Path]:
    """The ``n`` checkpoints of ``directory`` with the highest global step (``last*.ckpt`` links skipped
    when they duplicate another file's step), but never ``exclude`` (the average being written). Every
    checkpoint of the directory must be of one run (``check_one_run``, over all of them, not only the chosen:
    an older run's files with higher steps would otherwise be chosen instead of the new run's). Read
    memory-mapped: no tensor is read."""
    if n < 1:
        raise ValueError(f"last={n}: give the number of checkpoints to average, >= 1")
    directory = Path(directory)
    skip = Path(exclude).resolve() if exclude is not None else None
    files = [p for p in sorted(directory.glob("*.ckpt")) if p.resolve() != skip]
    if not files:
        raise FileNotFoundError(f"no *.ckpt files in {directory} (option dir=)"
                                + (f" besides the output {exclude}" if exclude is not None else ""))
    headers = {path: read_checkpoint(path, mmap=True) for path in files}
    check_one_run(headers, allow_mixed)
    by_step: dict[int, Path] = {}
    for path, checkpoint in headers.items():
        step = int(checkpoint.get("global_step") or 0)
        if step not in by_step or by_step[step].name.startswith("last"):
            by_step[step] = path  # one file per step, preferring a named one over last.ckpt
    chosen = [by_step[s] for s in sorted(by_step)[-n:]]
    if len(chosen) < n:
        print(f"warning: {directory} holds checkpoints of only {len(chosen)} distinct steps; averaging those",
              file=sys.stderr)
    return chosen


USAGE = ("python -m transformer_nmt.average (dir=DIR [last=N] | inputs=[a.ckpt,b.ckpt,...]) output=PATH "
         "[allow_mixed=true]")


@dataclass
class AverageOptions:
    dir: Optional[str] = option(None, "a directory of checkpoints: average its last= (highest steps)")
    last: int = option(5, "with dir=: how many checkpoints, those of the highest training steps (>= 1)")
    inputs: Optional[List[str]] = option(None, "the checkpoints to average, a list (instead of dir=)")
    output: Optional[str] = option(None, "the averaged checkpoint to write (never read: left out of dir=); never "
                                         "last.ckpt, and an existing file only if it is an earlier average")
    allow_mixed: bool = option(False, "average checkpoints of different training runs (another run identity, "
                                      "fingerprint or model config); another vocabulary or direction is refused "
                                      "even so")


OPTIONS = AverageOptions


def check_output(output: Path) -> None:
    """A SystemExit where writing the average to ``output`` would destroy what a run needs: ``last.ckpt``, or an
    existing file that is not an earlier average (the average holds weights alone, no optimizer state)."""
    if output.name == run_files.LAST:
        raise SystemExit(f"output={output}: {run_files.LAST} is the checkpoint a run resumes from, and an average "
                         f"holds no optimizer state to resume; write the average elsewhere (e.g. "
                         f"RUN_DIR/{run_files.AVERAGED})")
    if not (output.exists() or output.is_symlink()):
        return
    try:
        existing = read_checkpoint(output, mmap=True)
    except (CheckpointError, FileNotFoundError) as error:
        raise SystemExit(f"output={output} exists and is not a checkpoint ({error}): an average replaces an earlier "
                         f"average only; write it elsewhere, or remove the file yourself") from None
    if "optimizer_states" in existing:
        raise SystemExit(f"output={output} is a training checkpoint that holds optimizer state (a run can resume from "
                         f"it): the average, weights alone, would replace it; write the average elsewhere")
    if AVERAGED_FROM not in existing:
        raise SystemExit(f"output={output} is a checkpoint that is not an average (an input of averaging, not an "
                         f"output): write the average elsewhere, or remove the file yourself")


def main(argv: list[str] | None = None) -> Path:
    options = parse_options(command_argv(argv), AverageOptions, __doc__, USAGE)
    if not options.output:
        raise SystemExit("missing output=PATH")
    output = Path(options.output)
    check_output(output)
    try:
        if options.inputs is not None:
            paths = [Path(p) for p in options.inputs]
            if not paths:
                raise ValueError("inputs=[]: list the checkpoints to average")
            if any(p.resolve() == output.resolve() for p in paths):
                raise ValueError(f"output={output} is also one of the inputs: write the average elsewhere")
        elif options.dir:
            paths = last_checkpoints(options.dir, options.last, exclude=output, allow_mixed=options.allow_mixed)
        else:
            raise SystemExit("give dir=CHECKPOINT_DIR (with last=N, default 5) or inputs=[a.ckpt,b.ckpt,...]")
        averaged = average_checkpoints(paths, allow_mixed=options.allow_mixed)
    except (CheckpointError, ValueError, FileNotFoundError) as error:
        raise SystemExit(str(error)) from None
    atomic_torch_save(averaged, output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {output}")
    return output


if __name__ == "__main__":
    main()
