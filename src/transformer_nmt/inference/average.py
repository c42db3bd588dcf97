"""Checkpoint averaging (paper section 6.1: the base models average the last 5 checkpoints).

    python -m transformer_nmt.average dir=RUN_DIR/checkpoints/recent last=5 output=RUN_DIR/averaged.ckpt
    python -m transformer_nmt.average 'inputs=[a.ckpt,b.ckpt]' output=averaged.ckpt

"Last" means the highest training steps, read from the checkpoints themselves. The output holds the
element-wise mean of the model weights with the model config and tokenizer of the newest input, and
loads wherever a training checkpoint does (``evaluate``, ``translate``); it carries no optimizer state,
so training does not resume from it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import torch

from transformer_nmt.checkpoint import CheckpointError, atomic_torch_save, checkpoint_step, read_checkpoint
from transformer_nmt.options import command_argv, option, parse_options

AVERAGED_FROM = "averaged_from"


def average_checkpoints(paths: list[str | Path]) -> dict:
    """Average the model weights of ``paths`` (a list of training checkpoints) into one checkpoint dict.

    Checkpoints are memory-mapped and summed one at a time: memory holds one float64 copy of the
    weights, never the inputs' optimizer states.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    newest = max((read_checkpoint(p, mmap=True) for p in paths), key=lambda c: c.get("global_step") or 0)
    reference = newest["state_dict"]
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in reference.items() if v.is_floating_point()}
    for path in paths:
        weights = read_checkpoint(path, mmap=True)["state_dict"]
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


def last_checkpoints(directory: str | Path, n: int) -> list[Path]:
    """The ``n`` checkpoints of ``directory`` with the highest global step (``last*.ckpt`` links skipped
    when they duplicate another file's step). Steps are read memory-mapped: no tensor is read."""
    directory = Path(directory)
    files = sorted(directory.glob("*.ckpt"))
    if not files:
        raise FileNotFoundError(f"no *.ckpt files in {directory} (option dir=)")
    by_step: dict[int, Path] = {}
    for path in files:
        step = checkpoint_step(path)
        if step not in by_step or by_step[step].name.startswith("last"):
            by_step[step] = path  # one file per step, preferring a named one over last.ckpt
    chosen = [by_step[s] for s in sorted(by_step)[-n:]]
    if len(chosen) < n:
        print(f"warning: {directory} holds checkpoints of only {len(chosen)} distinct steps; averaging those",
              file=sys.stderr)
    return chosen


USAGE = "python -m transformer_nmt.average (dir=DIR [last=N] | inputs=[a.ckpt,b.ckpt,...]) output=PATH"


@dataclass
class AverageOptions:
    dir: Optional[str] = option(None, "a directory of checkpoints: average its last= (highest steps)")
    last: int = option(5, "with dir=: how many checkpoints, those of the highest training steps")
    inputs: Optional[List[str]] = option(None, "the checkpoints to average, a list (instead of dir=)")
    output: Optional[str] = option(None, "the averaged checkpoint to write")


OPTIONS = AverageOptions


def main(argv: list[str] | None = None) -> Path:
    options = parse_options(command_argv(argv), AverageOptions, __doc__, USAGE)
    if not options.output:
        raise SystemExit("missing output=PATH")
    if options.inputs is not None:
        paths = [Path(p) for p in options.inputs]
    elif options.dir:
        paths = last_checkpoints(options.dir, options.last)
    else:
        raise SystemExit("give dir=CHECKPOINT_DIR (with last=N, default 5) or inputs=[a.ckpt,b.ckpt,...]")
    averaged = average_checkpoints(paths)
    atomic_torch_save(averaged, options.output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {options.output}")
    return Path(options.output)


if __name__ == "__main__":
    main()
