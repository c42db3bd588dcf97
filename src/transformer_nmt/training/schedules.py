"""The learning-rate schedules (paper section 5.3, and a constant one for fine-tunes): the function per optimizer
step, its peak, and the one check of ``train.lr_schedule`` and ``train.warmup_steps`` (``check_schedule``)."""

from __future__ import annotations

from functools import partial


def inverse_sqrt_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Section 5.3: lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), step >= 1.

    Rises linearly for ``warmup_steps`` optimizer steps, then decays with the inverse square root of
    the step; the peak, at step = warmup_steps, is factor * (d_model * warmup_steps)^-0.5.
    """
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def warmup_inverse_sqrt_lr(step: int, peak: float, warmup_steps: int, init: float = 0.0) -> float:
    """The same schedule by its peak, as fairseq's ``inverse_sqrt`` states it: linear from ``init`` at step 0 to
    ``peak`` at ``warmup_steps``, then peak * (warmup_steps / step)^0.5. With ``init`` 0 and peak
    factor * (d_model * warmup_steps)^-0.5 it is ``inverse_sqrt_lr``."""
    step = max(step, 1)
    if step < warmup_steps:
        return init + (peak - init) * step / warmup_steps
    return peak * (warmup_steps / step) ** 0.5


def warmup_constant_lr(step: int, peak: float, warmup_steps: int, init: float = 0.0) -> float:
    """``train.lr_schedule=constant`` (a fine-tune's usual schedule): linear from ``init`` at step 0 to ``peak`` at
    ``warmup_steps`` (0: ``peak`` from the first step), then ``peak``."""
    step = max(step, 1)
    if step < warmup_steps:
        return init + (peak - init) * step / warmup_steps
    return peak


LR_SCHEDULES = ("inverse_sqrt", "constant")  # train.lr_schedule


def check_schedule(schedule: str, warmup_steps: int, error: type[Exception] = ValueError) -> None:
    """``error`` where ``train.lr_schedule`` is not one of ``LR_SCHEDULES``, or ``train.warmup_steps`` does not fit
    it: the inverse square root schedule peaks at step warmup_steps, which must be >= 1."""
    if schedule not in LR_SCHEDULES:
        raise error(f"train.lr_schedule={schedule!r}: use one of {', '.join(LR_SCHEDULES)}")
    if warmup_steps < (1 if schedule == "inverse_sqrt" else 0):
        raise error(f"train.warmup_steps={warmup_steps}: the inverse square root schedule peaks at step "
                    f"warmup_steps (>= 1); for no warm-up use train.lr_schedule=constant train.warmup_steps=0")


def peak_lr(optim: dict, d_model: int) -> float:
    """The schedule's peak (at step warmup_steps): ``train.lr`` where given, else 5.3's factor * (d_model *
    warmup)^-0.5."""
    if optim.get("lr") is not None:
        return float(optim["lr"])
    return inverse_sqrt_lr(max(optim["warmup_steps"], 1), d_model, max(optim["warmup_steps"], 1), optim["lr_factor"])


def scheduler_factor(scheduler_step: int, d_model: int, warmup_steps: int, factor: float,
                     peak: float | None = None, init: float = 0.0, schedule: str = "inverse_sqrt") -> float:
    """The lr at LambdaLR's step ``scheduler_step`` (its base lr being 1.0): ``train.lr_schedule``'s function, by
    ``peak`` (``train.lr``) where given, else by 5.3's factor."""
    # LambdaLR's step counter is 0 before the first optimizer step; the paper counts from 1.
    if schedule == "inverse_sqrt" and peak is None and init == 0.0:
        return inverse_sqrt_lr(scheduler_step + 1, d_model, warmup_steps, factor)  # the paper's, as written
    if peak is None:  # 5.3's peak (a constant schedule may have no warm-up: its peak at step 1 then)
        peak = inverse_sqrt_lr(max(warmup_steps, 1), d_model, max(warmup_steps, 1), factor)
    lr = warmup_constant_lr if schedule == "constant" else warmup_inverse_sqrt_lr
    return lr(scheduler_step + 1, peak, warmup_steps, init)


def lr_lambda(optim: dict, d_model: int):
    """The factor of the base lr (1.0) at each of LambdaLR's steps, for the ``train.*`` options ``optim``
    (TrainConfig's fields) and the model's ``d_model``."""
    return partial(scheduler_factor, d_model=d_model, warmup_steps=optim["warmup_steps"], factor=optim["lr_factor"],
                   peak=optim["lr"], init=optim["warmup_init_lr"], schedule=optim["lr_schedule"])
