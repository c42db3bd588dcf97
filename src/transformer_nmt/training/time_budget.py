"""Where a training run's wall time goes, and the training step's model FLOPs utilisation (MFU).

``TimeBudget`` is a callback: it times phases of the run from Lightning's hooks with ``time.perf_counter``
(no device sync, no per-step host read), each second counted in exactly one phase (a phase entered inside
another is subtracted from the outer one):

- ``training_steps``: from ``on_train_batch_start`` to ``on_train_batch_end`` (forward, loss, backward,
  optimizer step: everything of the step but fetching its batch);
- ``validation``: the validation loops (greedy decoding for BLEU, loss), sanity check included;
- ``checkpointing``: writing checkpoint files (timed in checkpoint_io.AtomicCheckpointIO, which the app
  builds with the run's budget: ``AtomicCheckpointIO(time_budget=TimeBudget.of(callbacks))``);
- ``attention_maps``: callbacks.AttentionMaps' forward passes on the training path, and the training
  thread's waits for a render to finish (rendering itself runs in a background thread, beside the other
  phases);
- ``mfu_probe``: the matmul ceiling measured once at the end of training (below);
- ``fit_other``: the rest of ``trainer.fit``: fetching batches, logging, other callbacks, set-up;
- ``test``: the test loop after fit.

What is outside all of them (interpreter start-up, imports, data preparation, loading the checkpoint to test)
is the run's wall time minus their sum: ``report(wall_seconds)`` gives it as ``outside_phases``.

On a CUDA device the host runs ahead of the device, so a phase's seconds land where the host waits (the
phases' sum stays right; the split between neighbouring phases is approximate). Under DDP every rank times
itself; results.json holds global rank 0's view.

MFU: the model FLOPs of every training batch (flops.FlopCount, summed on the device and read once, at the
end) over the ``training_steps`` seconds, against ``flops.matmul_ceiling`` measured at the end of training
in this process, at the model's shapes with as many rows as the mean training batch's target side, in the
run's compute dtype (bf16 under bf16-mixed, else fp32) and thread count.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager, nullcontext

import lightning.pytorch as pl

from transformer_nmt.model.flops import FlopCount, matmul_ceiling
from transformer_nmt.training.precision import compute_dtype

PHASES = ("training_steps", "validation", "checkpointing", "attention_maps", "mfu_probe", "fit_other", "test")


def timed(budget: TimeBudget | None, phase: str):
    """``budget.phase(phase)``, or nothing where no TimeBudget is attached."""
    return budget.phase(phase) if budget is not None else nullcontext()


class BackgroundWork(ABC):
    """A callback with work running beside training (a thread), which the TimeBudget waits for at the end of
    training, before it measures the matmul ceiling on the same cores; the wait counts in the callback's
    ``phase``. callbacks.AttentionMaps is one (its renders). Defined here, not looked up there, so that this
    module does not import the callbacks that time themselves with it."""

    phase: str  # one of PHASES

    @abstractmethod
    def wait(self) -> None:
        """Block until the work running in the background is done."""


class TimeBudget(pl.Callback):
    """Seconds per phase of the run and the training step's MFU (module doc). What times its own work in it
    is handed it explicitly: the checkpoint IO plugin at construction, callbacks.AttentionMaps looks it up in
    ``trainer.callbacks`` (``TimeBudget.of``) at set-up; both time with ``timed(budget, phase)``.

    ``probe_seconds``: the matmul ceiling's measurement, at most this long and at most 2% of the fit's
    wall time (a tiny test run spends milliseconds on it)."""

    def __init__(self, probe_seconds: float = 1.5):
        self.probe_seconds = probe_seconds
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._stack: list[str] = []
        self._mark = 0.0
        self._fit_started = None
        self.fit_seconds = 0.0
        self._flops = None  # float64 scalar on the device: model FLOPs of the training batches so far
        self._count = None
        self.batches, self.rows = 0, 0  # training batches, and target rows (padded tokens) over them
        self.ceiling = None

    # --- exclusive phase accounting -----------------------------------------------------------
    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        if self._stack:
            self.seconds[self._stack[-1]] += now - self._mark
        self._stack.append(phase)
        self._mark = now

    def exit(self, phase: str) -> None:
        if phase not in self._stack:  # an exception skipped the enter; nothing to close
            return
        now = time.perf_counter()
        self.seconds[self._stack[-1]] += now - self._mark
        while self._stack.pop() != phase:  # phases an exception left open close with it
            pass
        self._mark = now

    @contextmanager
    def phase(self, phase: str):
        self.enter(phase)
        try:
            yield
        finally:
            self.exit(phase)

    @staticmethod
    def of(callbacks) -> TimeBudget | None:
        """The TimeBudget among ``callbacks`` (a run's, or ``trainer.callbacks``), None if there is none."""
        return next((c for c in callbacks if isinstance(c, TimeBudget)), None)

    # --- hooks ----------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if self._count is None:
            self._count = FlopCount.of(pl_module.model)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_started = time.perf_counter()
        self.enter("fit_other")

    def on_fit_end(self, trainer, pl_module) -> None:
        self.exit("fit_other")
        if self._fit_started is not None:
            self.fit_seconds += time.perf_counter() - self._fit_started

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.enter("training_steps")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        flops = self._count(batch["src"], batch["tgt"])  # on the device: read at the end only
        self._flops = flops if self._flops is None else self._flops + flops
        self.batches += 1
        self.rows += batch["tgt"][:, 1:].numel()
        self.exit("training_steps")

    def on_validation_start(self, trainer, pl_module) -> None:
        self.enter("validation")

    def on_validation_end(self, trainer, pl_module) -> None:
        self.exit("validation")

    def on_test_start(self, trainer, pl_module) -> None:
        self.enter("test")

    def on_test_end(self, trainer, pl_module) -> None:
        self.exit("test")

    def on_train_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or not self.batches:
            return
        for callback in trainer.callbacks:  # a background render would share the cores with the probe
            if isinstance(callback, BackgroundWork):
                with timed(self, callback.phase):
                    callback.wait()
        c = pl_module.model.config
        elapsed = time.perf_counter() - self._fit_started if self._fit_started is not None else 0.0
        with self.phase("mfu_probe"):
            self.ceiling = matmul_ceiling(c.d_model, c.d_ff, c.vocab_size, round(self.rows / self.batches),
                                          compute_dtype(trainer.precision),
                                          seconds=min(self.probe_seconds, 0.02 * elapsed), device=pl_module.device)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        while self._stack:
            self.exit(self._stack[-1])

    # --- results ------------------------------------------------------------------------------
    def mfu(self) -> dict | None:
        """Model FLOPs of the training batches, their rate over the training steps' seconds, the ceiling and
        the share of it; None before any batch."""
        if self._flops is None or not self.seconds["training_steps"]:
            return None
        flops = float(self._flops)
        achieved = flops / self.seconds["training_steps"] / 1e9
        report = {"model_gflop": round(flops / 1e9, 1), "training_batches": self.batches,
                  "mean_target_rows": round(self.rows / self.batches), "achieved_gflops": round(achieved, 2),
                  "achieved_gflops_over_fit": round(flops / self.fit_seconds / 1e9, 2) if self.fit_seconds else None}
        if self.ceiling is not None:
            report["ceiling"] = self.ceiling
            report["share_of_ceiling"] = round(achieved / self.ceiling["ceiling_gflops"], 4)
        return report

    def report(self, wall_seconds: float | None = None) -> dict:
        """{"seconds": per phase, "fit_seconds", "wall_seconds", "outside_phases" (the wall time no phase
        holds), "share": per phase and outside, of ``wall_seconds``, "mfu", "rank": 0}; ``wall_seconds``: the
        run's (train.train's), shares only when given."""
        seconds = {phase: round(s, 2) for phase, s in self.seconds.items()}
        report = {"seconds": seconds, "fit_seconds": round(self.fit_seconds, 2), "rank": "global rank 0"}
        if wall_seconds:
            outside = max(wall_seconds - sum(self.seconds.values()), 0.0)
            report.update(wall_seconds=round(wall_seconds, 2), outside_phases=round(outside, 2),
                          share={**{p: round(s / wall_seconds, 4) for p, s in self.seconds.items()},
                                 "outside_phases": round(outside / wall_seconds, 4)})
        report["mfu"] = self.mfu()
        return report
