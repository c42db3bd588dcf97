"""A moving average of the weights against averaging the last checkpoints, and both (issue 39).

    python studies/ema_study.py run=outputs/multi30k_cpu_en_de/RUN last=5 out=ema_study.json

RUN trained with ``train.ema_decay``: each of its checkpoints/recent/ holds the trained weights
(``raw_state_dict``) and their moving average (``state_dict``, the decoding weights). Four models from the newest
``last`` of them, each scored with ``evaluate`` (beam ``beam``, the recipe's search) on every split of ``splits``:

- the trained weights of the newest checkpoint (what a run without the average decodes with);
- the trained weights of the newest ``last`` averaged (``average_checkpoints``, as the recipe's averaged.ckpt);
- the moving average of the newest checkpoint;
- the moving averages of the newest ``last`` averaged (what ``reproduce`` averages for such a run).

The row with the best BLEU on the first split (val) is chosen (``select_on=NAME``: the best value of another
registered metric, in its direction); the test set is never used for a choice. Writes
``out`` (JSON: every row's cased, lowercased and Multi30k-convention BLEU, chrF, length ratio and decode seconds
per split, the choice, the provenance) and prints the table; the models and evaluate's files go under ``work``
(default outputs/ema_study/<out's stem>/, which git ignores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ensemble_study import (  # studies/: one way of scoring a row and choosing on val
    SELECT_ON,
    choose_on_val,
    markdown,
    score_row,
    selection_metric,
)

from transformer_nmt.checkpoint import atomic_torch_save, read_checkpoint
from transformer_nmt.inference.average import average_checkpoints, last_checkpoints
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance
from transformer_nmt.training.ema import CKPT_EMA, CKPT_RAW_WEIGHTS

OPTIONS = {"run": None, "last": 5, "beam": 4, "splits": ["val", "test"], "threads": 0, "max_tokens": 4096,
           "select_on": SELECT_ON, "out": "ema_study.json", "work": None}
WORK = Path("outputs") / "ema_study"
USAGE = "python studies/ema_study.py run=RUN [last=5] [beam=4] [select_on=bleu] [out=FILE.json]"
TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks", CKPT_RAW_WEIGHTS)


def trained_weights_copy(path: Path, work: Path) -> Path:
    """``path`` with its trained weights as its decoding weights (no training state): what evaluate and
    average_checkpoints read."""
    checkpoint = read_checkpoint(path)
    if CKPT_RAW_WEIGHTS not in checkpoint or CKPT_EMA not in checkpoint:
        raise SystemExit(f"{path}: no moving average in it ({CKPT_RAW_WEIGHTS!r}): train the run with "
                         f"train.ema_decay")
    copy = {k: v for k, v in checkpoint.items() if k not in TRAINING_STATE}
    copy["state_dict"] = checkpoint[CKPT_RAW_WEIGHTS]
    out = work / "trained" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(copy, out)
    return out


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["run"]:
        raise SystemExit("give run=RUN: a run trained with train.ema_decay")
    if not isinstance(options["last"], int) or options["last"] < 2:
        raise SystemExit(f"last={options['last']}: give a whole number >= 2")
    selection_metric(options["select_on"])
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    run = Path(options["run"])
    recent = last_checkpoints(run / "checkpoints" / "recent", options["last"])
    work = Path(options["work"] or WORK / Path(options["out"]).stem)
    work.mkdir(parents=True, exist_ok=True)
    trained = [trained_weights_copy(path, work) for path in recent]  # every input checked before decoding
    averages = {}
    for name, paths in (("trained", trained), ("moving", recent)):
        averages[name] = work / f"{name}_average_last{len(paths)}.ckpt"
        atomic_torch_save(average_checkpoints(paths), averages[name])
    k = len(recent)
    rows = [score_row("newest trained weights", [trained[-1]], options, work),
            score_row(f"trained weights averaged over {k}", [averages["trained"]], options, work),
            score_row("newest moving average", [recent[-1]], options, work),
            score_row(f"moving averages averaged over {k}", [averages["moving"]], options, work)]
    ema = read_checkpoint(recent[-1])[CKPT_EMA]
    chosen = {"weights": choose_on_val(rows, options["splits"][0], options["select_on"])}
    result = {"options": options, "ema": ema, "checkpoints": [str(p) for p in recent],
              "groups": {"weights": rows}, "chosen_on": options["splits"][0], "chosen": chosen,
              PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown({"weights": rows}, chosen, options["splits"]))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
