"""Continuing a checkpoint's training with changes: ``init_from=CKPT init_keep=[...]``.

``init_from`` alone is a fine-tune: the checkpoint's weights, architecture and tokenizer, and everything else fresh.
``init_keep`` names what else the run continues, each independently (fairseq's ``--reset-optimizer``,
``--reset-lr-scheduler``, ``--reset-dataloader`` and ``--reset-meters`` seen from the other side):

- ``optimizer``: Adam's moments and step counts (the run's own betas, eps and lr apply to them);
- ``schedule``:  the lr schedule's position (the run's own schedule function, at the checkpoint's step);
- ``step``:      the optimizer step counter (``trainer.max_steps``, logging, checkpoint names and dropout seeds go on
                 from it);
- ``data``:      the epoch and the position in it (the batch order goes on where the checkpoint stopped).

What is never kept: the callbacks' state (best checkpoints, early stopping's patience, the averaging window, the
time budget), the moving average of the weights (it restarts at the trained weights) and the run's identity: the
child is another run, whose checkpoints ``average`` never mixes with the parent's. With anything kept the weights are
the parent's trained ones (its ``raw_state_dict`` where it kept a moving average), which its optimizer state belongs
to.

``continuation_checkpoint`` builds, from the parent's checkpoint and the fresh state of this run, the checkpoint a
fresh start restores through Lightning's own resume, so a kept data position is restored exactly as a resume
restores it (mid-epoch included). A later launch of the child resumes its own checkpoints as any run does.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformer_nmt.checkpoint import CKPT_FINGERPRINT, CKPT_OVERRIDES, CKPT_RAW_WEIGHTS, CKPT_RUN
from transformer_nmt.training.ema import CKPT_EMA
from transformer_nmt.training.fingerprint import DEFAULTED

KEEPABLE = ("optimizer", "schedule", "step", "data")
# Lightning's loop state (trainer.fit_loop.state_dict()) that each kept item carries over
STEP_STATE = ("epoch_loop.state_dict", "epoch_loop.scheduler_progress")  # with the optimizer steps' totals
DATA_STATE = ("epoch_progress", "epoch_loop.batch_progress", "state_dict")  # epoch, batch in it, sampler position
OPTIM_PROGRESS = "epoch_loop.automatic_optimization.optim_progress"


class ContinuationError(ValueError):
    """``init_keep`` cannot be honoured with this checkpoint and run; the message names the option."""


def check_keep(keep: Sequence[str] | None, init_from: str | None) -> list[str]:
    """``init_keep`` as a list of ``KEEPABLE`` items, or ``ContinuationError`` naming what is wrong."""
    keep = list(keep or [])
    unknown = [item for item in keep if item not in KEEPABLE]
    if unknown:
        raise ContinuationError(f"init_keep={keep}: {unknown} not among {list(KEEPABLE)}")
    if keep and not init_from:
        raise ContinuationError(f"init_keep={keep} needs init_from=CKPT: the checkpoint whose training it continues")
    return keep


def check_same_training(parent: dict, keep: Sequence[str], source: str, fingerprint: dict) -> None:
    """What a kept item needs the child to share with the parent, from the parent's recorded fingerprint: with
    ``optimizer``, the frozen parameters (Adam's state is matched to the trained tensors by position); with ``data``,
    every data setting and the training files' contents (the saved position indexes the parent's batch plan).
    ``fingerprint``: this run's (training/fingerprint.run_fingerprint). A ``ContinuationError`` names what differs."""
    recorded = parent.get(CKPT_FINGERPRINT)
    if not isinstance(recorded, dict):
        if keep:
            raise ContinuationError(f"init_keep={list(keep)}: {source} records no run fingerprint (written before "
                                    f"they existed): what it trained on cannot be compared; use it without init_keep")
        return
    needs = {"optimizer": lambda key: key == "train.freeze",
             "data": lambda key: key.startswith("data.") and key not in ("data.tokenizer_path",)}
    for item, concerns in needs.items():
        if item not in keep:
            continue
        saved, current = {**DEFAULTED, **recorded}, {**DEFAULTED, **fingerprint}  # (not a resume's tolerances)
        changed = {key: (saved.get(key), current.get(key)) for key in saved.keys() | current.keys()
                   if concerns(key) and saved.get(key) != current.get(key)}
        differ = sorted(changed)
        if differ:
            shown = "; ".join(f"{key}: {old!r:.60} -> {new!r:.60}" for key, (old, new) in changed.items())
            raise ContinuationError(f"init_keep={list(keep)}: keeping {item} needs the same {', '.join(differ)} as "
                                    f"{source} ({shown}); set them as the parent had them, or drop {item} from "
                                    f"init_keep")


def check_trains_something(parent: dict, keep: Sequence[str], source: str, max_steps: int | None,
                           max_epochs: int | None) -> None:
    """``ContinuationError`` naming both numbers where what ``keep`` carries over from ``parent`` (the checkpoint
    ``source``) already reaches this run's end: a kept step at or above ``trainer.max_steps`` (which counts the kept
    steps), or a kept data position whose finished epochs reach ``trainer.max_epochs``. Lightning would skip the fit
    and the run would report a fine-tune that trained nothing as finished."""
    keep = list(keep)
    step = int(parent.get("global_step") or 0)
    if "step" in keep and max_steps not in (None, -1) and max_steps <= step:
        raise ContinuationError(f"init_keep={keep} continues {source}'s step counter at {step:,}, and "
                                f"trainer.max_steps={max_steps:,} is at or below it: the run would train nothing. Set "
                                f"trainer.max_steps above {step:,} (it counts the kept steps), or drop step from "
                                f"init_keep")
    progress = ((parent.get("loops") or {}).get("fit_loop") or {}).get("epoch_progress") or {}
    finished = (progress.get("current") or {}).get("processed")
    if "data" in keep and isinstance(finished, int) and max_epochs not in (None, -1) and max_epochs <= finished:
        raise ContinuationError(f"init_keep={keep} continues {source}'s data position after {finished} finished "
                                f"epoch(s), and trainer.max_epochs={max_epochs} is at or below it: the run would "
                                f"train nothing. Set trainer.max_epochs above {finished} (it counts the kept epochs), "
                                f"or drop data from init_keep")


def continuation_checkpoint(parent: dict, keep: Sequence[str], source: str, *, fresh_optimizer: dict,
                            fresh_scheduler: dict, schedule, fresh_loops: dict, training_run: str,
                            ema: dict | None) -> dict:
    """The checkpoint a fresh run with ``init_keep=keep`` starts from (see the module doc).

    ``parent``: the checkpoint ``source`` (init_from) holds; ``fresh_optimizer``/``fresh_scheduler``: the
    ``state_dict()`` of this run's optimizer and lr scheduler as configured, before any step; ``schedule``: its lr
    factor as a function of the step; ``fresh_loops``: ``trainer.fit_loop.state_dict()`` before the fit;
    ``training_run``: this run's identity; ``ema``: this run's moving-average record ({decay, warmup}) or None."""
    keep = list(keep)
    for key in (("optimizer_states", "lr_schedulers", "loops") if keep else ()):
        if key not in parent:
            raise ContinuationError(f"init_keep={keep}: {source} holds no {key!r}: it is not a checkpoint of a "
                                    f"training run (an average, an export or an import has weights only); use it "
                                    f"without init_keep (a fine-tune)")
    trained = parent.get(CKPT_RAW_WEIGHTS, parent["state_dict"])  # what the optimizer state belongs to
    optimizer = _optimizer_state(parent["optimizer_states"][0], fresh_optimizer, source, trained, keep) \
        if "optimizer" in keep else fresh_optimizer
    scheduler = dict(fresh_scheduler)
    if "schedule" in keep:
        position = int(parent["lr_schedulers"][0]["last_epoch"])
        scheduler.update(last_epoch=position, _step_count=position + 1)
    scheduler["_last_lr"] = [base * schedule(scheduler["last_epoch"]) for base in scheduler["base_lrs"]]
    optimizer = {**optimizer, "param_groups": [{**group, "lr": lr}  # the lr the first step uses
                                               for group, lr in zip(optimizer["param_groups"], scheduler["_last_lr"])]}
    loops = _loops(parent["loops"]["fit_loop"], fresh_loops, keep) if keep else fresh_loops
    dropped = ("callbacks", CKPT_RAW_WEIGHTS, CKPT_EMA, CKPT_FINGERPRINT, CKPT_OVERRIDES)  # the parent's, not ours
    checkpoint = {k: v for k, v in parent.items() if k not in dropped}
    checkpoint.update(state_dict=trained, optimizer_states=[optimizer], lr_schedulers=[scheduler],
                      loops={"fit_loop": loops}, callbacks={},
                      global_step=parent.get("global_step", 0) if "step" in keep else 0,
                      epoch=parent.get("epoch", 0) if "data" in keep else 0)
    checkpoint[CKPT_RUN] = training_run
    if ema is not None:  # the average restarts at the trained weights (module.on_load_checkpoint reads it so)
        checkpoint[CKPT_RAW_WEIGHTS] = trained
        checkpoint[CKPT_EMA] = {**ema, "updates": 0}
    return checkpoint


def _optimizer_state(saved: dict, fresh: dict, source: str, trained: dict, keep: list[str]) -> dict:
    """The parent's Adam state over this run's parameters, with this run's hyperparameters (betas, eps, lr); refused
    where the tensors it holds do not match those this run trains (another train.freeze)."""
    saved_params = [p for group in saved["param_groups"] for p in group["params"]]
    fresh_params = [p for group in fresh["param_groups"] for p in group["params"]]
    if len(saved_params) != len(fresh_params) or len(saved["param_groups"]) != len(fresh["param_groups"]):
        raise ContinuationError(f"init_keep={keep}: the optimizer state of {source} is over {len(saved_params)} "
                                f"tensors, this run trains {len(fresh_params)} (another train.freeze?): keep the "
                                f"parent's train.freeze, or drop optimizer from init_keep")
    shapes = [tuple(v.shape) for k, v in trained.items() if v.is_floating_point()]
    for index, state in saved["state"].items():
        moment = state.get("exp_avg")
        if moment is not None and tuple(moment.shape) not in shapes:
            raise ContinuationError(f"init_keep={keep}: the optimizer state of {source} holds a tensor of shape "
                                    f"{tuple(moment.shape)} that no weight of the model has")
    # every setting this run's (lr, betas, eps, the fused kernel on its device), the parent's moments
    groups = [{**fresh_group, "params": saved_group["params"]}
              for saved_group, fresh_group in zip(saved["param_groups"], fresh["param_groups"])]
    return {"state": saved["state"], "param_groups": groups}


def _loops(saved: dict, fresh: dict, keep: list[str]) -> dict:
    """Lightning's fit-loop state: the fresh one, with the parent's step counters and data position as kept."""
    loops = {key: value for key, value in fresh.items()}
    progress = {k: dict(v) for k, v in fresh[OPTIM_PROGRESS]["optimizer"].items()}
    saved_progress = saved[OPTIM_PROGRESS]["optimizer"]
    if "step" in keep:
        for key in STEP_STATE:
            loops[key] = saved[key]
        for counter in progress:  # "step", "zero_grad": their totals are the global step
            progress[counter]["total"] = saved_progress[counter]["total"]
    if "data" in keep:
        for key in DATA_STATE:
            loops[key] = saved[key]
        for counter in progress:  # their place within the epoch goes with it
            progress[counter]["current"] = saved_progress[counter]["current"]
    loops[OPTIM_PROGRESS] = {"optimizer": progress}
    return loops
