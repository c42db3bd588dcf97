"""Callbacks: per-head attention maps in TensorBoard, ``last.ckpt`` after every validation, the best-k
checkpoints and early stopping on the monitored metric (val BLEU or loss), and a progress bar with tokens/s and ETA.

(Atomic checkpoint writing is a CheckpointIO plugin, in checkpoint_io.py; the maps themselves are drawn by
inference/attention_maps.py.)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback, Checkpoint, EarlyStopping, ModelCheckpoint, Timer, TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from omegaconf import DictConfig
from tensorboard.compat.proto import types_pb2
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.image import metadata as image_metadata

from transformer_nmt import run_files
from transformer_nmt.checkpoint import CKPT_FINGERPRINT, CKPT_OVERRIDES
from transformer_nmt.data.language_tags import LanguageTags
from transformer_nmt.inference.attention_maps import ATTENTION_KINDS, attention_entropy, render_heatmaps
from transformer_nmt.metrics import catalog
from transformer_nmt.training.fingerprint import run_fingerprint
from transformer_nmt.training.time_budget import BackgroundWork, TimeBudget, timed

log = logging.getLogger(__name__)

def image_summary(tag: str, pngs: list[bytes], width: int, height: int) -> Summary:
    """A TensorBoard image summary holding several images (samples) under one tag: the format of
    ``tf.summary.image``, a string tensor [width, height, png_0, png_1, ...]. The image card shows one
    sample at a time, each at full card width.

    Built by hand from TensorBoard's protos (the ones torch.utils.tensorboard.summary builds its own from):
    TensorBoard's own builder of this format (``tensorboard.summary.v1.image_pb``) needs TensorFlow, and
    torch's (``summary.image``) takes one array per tag and encodes it itself."""
    tensor = TensorProto(dtype=types_pb2.DT_STRING, string_val=[str(width).encode(), str(height).encode(), *pngs],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=2 + len(pngs))]))
    metadata = image_metadata.create_summary_metadata(display_name=tag, description="")
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=metadata)])


class AttentionMaps(Callback, BackgroundWork):
    """Every ``every_n_validations`` validations, run fixed probe sentences through the model and log,
    for every (kind, layer, head), the head's maps under ``attention/{kind}/layer_{l}/head_{h}`` (one
    image per probe, the tag's samples) and its mean attention entropy under
    ``attention_entropy/{kind}/layer_{l}/head_{h}``; kind is encoder-self, decoder-self or cross (paper
    section 3.2.3; compare its figures 3-5).

    ``probes``: a list of ``[source, target]`` pairs (the decoder is teacher-forced with the target)
    or of source strings (the target is the model's greedy translation). Default: the first
    ``n_probes`` pairs of the validation split. Sentences are cut to ``max_tokens`` subwords.

    A model of several pairs (data.pairs) reads each probe as training does, with its direction's tags
    (data/language_tags.py): a validation pair with its own, a given probe with the first pair's. ``per_pair``:
    maps for every pair, each under ``attention/{pair}/...`` and ``attention_entropy/{pair}/...`` (en-fr:
    ``attention/en-fr/cross/layer_0/head_0``), from the first ``n_probes`` of that pair's validation part, or the
    given probes' sources translated greedily in each direction.

    Only global rank 0 works, and only the forward passes over the probes are on the training path (the
    other ranks wait for them at their next collective); a background thread renders and writes the images
    while training goes on. Each time, ``attention_maps/seconds`` (training path) and
    ``attention_maps/render_seconds`` (background) go to TensorBoard and a line to the log; the training-path
    seconds also count as ``attention_maps`` in the run's time budget (time_budget.TimeBudget), and so does the
    budget's wait for the last render at the end of training (a ``time_budget.BackgroundWork``).
    """

    phase = "attention_maps"

    def __init__(self, every_n_validations: int = 1, probes: list | None = None, n_probes: int = 2,
                 max_tokens: int = 32, inches: float = 6.0, dpi: int = 80, per_pair: bool = False):
        if every_n_validations < 1:
            raise ValueError(f"attention_maps.every_n_validations must be >= 1, got {every_n_validations}")
        self.every_n_validations = every_n_validations
        self.probes = [p if isinstance(p, str) else tuple(p) for p in probes] if probes else None
        self.n_probes, self.max_tokens, self.per_pair = n_probes, max_tokens, per_pair
        self.inches, self.dpi = inches, dpi
        self.validations = 0
        self._render: threading.Thread | None = None
        self.time_budget = None  # the run's time_budget.TimeBudget, found at set-up: times the training-path work

    def state_dict(self) -> dict:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict) -> None:
        self.validations = state_dict["validations"]

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.time_budget = TimeBudget.of(trainer.callbacks)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self.validations += 1
        if (self.validations - 1) % self.every_n_validations or not trainer.is_global_zero:
            return
        writer = getattr(trainer.logger, "experiment", None)
        if not hasattr(writer, "add_image"):
            rank_zero_warn("AttentionMaps needs a TensorBoardLogger; no attention maps logged")
            return
        start = time.perf_counter()
        with timed(self.time_budget, "attention_maps"):
            self.wait()  # for the previous maps, if validations come faster than they render
            was_training = pl_module.training
            pl_module.eval()
            try:
                maps = {pair: self.attention_weights(pl_module.model, pl_module.tokenizer, probes)
                        for pair, probes in self._probe_groups(trainer).items()}
            except Exception:  # only this rank draws: raising would stop it alone, and hang the others
                log.exception("attention maps at step %d: the probes failed; training goes on without these maps",
                              trainer.global_step)
                return
            finally:
                pl_module.train(was_training)
        seconds, step = time.perf_counter() - start, trainer.global_step
        writer.add_scalar("attention_maps/seconds", seconds, step)
        self._render = threading.Thread(target=self._write_in_background, args=(writer, maps, step, seconds),
                                        name="attention-maps", daemon=True)
        self._render.start()

    def _write_in_background(self, writer, maps: dict, step: int, seconds: float) -> None:
        try:
            start = time.perf_counter()
            images = sum(self.write(writer, pair_maps, step, pair) for pair, pair_maps in maps.items())
            render_seconds = time.perf_counter() - start
            writer.add_scalar("attention_maps/render_seconds", render_seconds, step)
            writer.flush()
            log.info("attention maps at step %d: %.2f s on the training path, %.2f s rendering %d images in the "
                     "background", step, seconds, render_seconds, images)
        except Exception:  # logged, never raised: a drawing must not stop training, nor the test after fit
            log.exception("attention maps at step %d could not be drawn; training goes on without them", step)

    def wait(self) -> None:
        """Block until the maps being rendered are written (or their failure logged)."""
        if self._render is not None:
            self._render.join()
            self._render = None

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.wait()  # before the logger closes its writer

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._render is not None:
            self._render.join()

    def _probe_groups(self, trainer) -> dict[str | None, list]:
        """{pair name (None: the tags of one group, attention/...): its probes, each (source, target or None,
        direction or None)}."""
        datamodule = getattr(trainer, "datamodule", None)  # given probes need none
        config = getattr(datamodule, "config", None)
        tags = LanguageTags.of(config) if config is not None and hasattr(config, "pairs") else None
        directions = [None] if tags is None else [tags.direction(*pair) for pair in tags.pairs]
        if self.probes is not None:
            given = [(p, None) if isinstance(p, str) else tuple(p) for p in self.probes]
            if self.per_pair and tags is not None:
                return {d.name: [(source, None, d) for source, _ in given] for d in directions}
            return {None: [(source, target, directions[0]) for source, target in given]}
        sources, targets = datamodule.sources("val"), datamodule.references("val")
        if tags is None:
            return {None: [(s, t, None) for s, t in zip(sources[: self.n_probes], targets[: self.n_probes])]}
        groups = datamodule.pair_indices("val")
        probes = {d.name: [(sources[i], targets[i], d) for i in groups[d.name][: self.n_probes].tolist()]
                  for d in directions}
        if self.per_pair:
            return probes
        first = [(i, d) for d in directions for i in groups[d.name].tolist()]  # val's order: data.pairs'
        first = sorted(first, key=lambda item: item[0])[: self.n_probes]
        return {None: [(sources[i], targets[i], d) for i, d in first]}

    @torch.no_grad()
    def attention_weights(self, model, tokenizer, probes: list) -> dict:
        """Run each probe (a source string, ``[source, target]``, or ``(source, target or None, direction)``, a
        tagged model's direction) through ``model``: {kind: [(weights (layers, h, Lq, Lk), key pieces, query
        pieces) for each probe]}, on the CPU. A direction's ids are those training read (its source tag; style
        decoder, its target tag forced first)."""
        from transformer_nmt.generation.config import DecodeConfig
        from transformer_nmt.generation.search import greedy_search
        from transformer_nmt.inference.attention_weights import teacher_forced_attention

        device = model.device
        maps = {}
        for probe in probes:
            source, target, direction = (probe, None, None) if isinstance(probe, str) else (*probe, None)[:3]
            src = (tokenizer.encode(source) if direction is None else direction.encode(tokenizer, [source])[0])
            src = src[: self.max_tokens - 1] + [tokenizer.eos_id]
            src_t = torch.tensor([src], device=device)  # (1, S)
            lead = [] if direction is None else direction.decoder_prefix(tokenizer)
            if target is not None:
                tgt_ids = lead + tokenizer.encode(target, target=True)
            else:  # greedy, from the forced tag where there is one (its tokens then start with it)
                prefix = torch.tensor([lead], device=device) if lead else None  # (1, P)
                tgt_ids = greedy_search(model, src_t, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                                        max_len_offset=DecodeConfig().max_len_offset, prefix=prefix)[0].tokens
            tgt_ids = tgt_ids[: self.max_tokens - 1]
            src_pieces = [tokenizer.id_to_piece(i) for i in src]
            tgt_pieces = [tokenizer.id_to_piece(i) for i in [tokenizer.bos_id] + tgt_ids]
            keys = {"encoder": src_pieces, "decoder": tgt_pieces, "cross": src_pieces}
            queries = {"encoder": src_pieces, "decoder": tgt_pieces, "cross": tgt_pieces}
            for kind, weights in teacher_forced_attention(model, src, tgt_ids, tokenizer.bos_id).items():
                maps.setdefault(kind, []).append((weights, keys[kind], queries[kind]))  # (layers, h, Lq, Lk)
        return maps

    def write(self, writer, maps: dict, step: int, pair: str | None = None) -> int:
        """Log one image per probe and one entropy scalar per (kind, layer, head), under attention/{pair}/... where
        ``pair`` is given; returns the image count."""
        size = round(self.inches * self.dpi)
        images = 0
        for kind, per_probe in maps.items():
            tag_kind = ATTENTION_KINDS[kind]
            n_layers, n_heads = per_probe[0][0].shape[:2]
            pngs = [render_heatmaps(weights.flatten(0, 1).numpy(), keys, queries,  # per probe, (layer, head) major
                                    [f"{pair + ' ' if pair else ''}{tag_kind} layer {layer} head {head}, probe {i}"
                                     for layer in range(n_layers) for head in range(n_heads)], self.inches, self.dpi)
                    for i, (weights, keys, queries) in enumerate(per_probe)]
            for layer in range(n_layers):
                entropy = torch.stack([attention_entropy(w[layer : layer + 1])  # (h,) per probe
                                       for w, _, _ in per_probe]).mean(0)
                for head in range(n_heads):
                    name = f"{pair + '/' if pair else ''}{tag_kind}/layer_{layer}/head_{head}"
                    samples = [probe_pngs[layer * n_heads + head] for probe_pngs in pngs]
                    writer.add_scalar(f"attention_entropy/{name}", float(entropy[head]), step)
                    # add_image(s) would tile the probes into one image; this keeps one image per probe under one
                    # tag, through the writer's public FileWriter (torch.utils.tensorboard.writer.FileWriter), which
                    # the add_scalar above has (re)opened if the logger had closed the writer.
                    writer.file_writer.add_summary(image_summary(f"attention/{name}", samples, size, size), step)
                    images += len(samples)
        return images

    def log_maps(self, writer, model, tokenizer, probes: list, step: int, pair: str | None = None) -> int:
        """Compute, render and write the maps of ``probes`` now, on this thread (under attention/{pair}/... where
        ``pair`` is given); returns the image count."""
        images = self.write(writer, self.attention_weights(model, tokenizer, probes), step, pair)
        writer.flush()
        return images


class LastCheckpoint(Checkpoint):
    """``RUN_DIR/checkpoints/last.ckpt``: after every validation, every ``every_n_train_steps`` optimizer
    steps (None: not by steps; set it for mid-epoch resume) and at the end of training (after the batch where it
    stops mid-epoch: max_steps or max_time), always on an optimizer step's boundary: a validation inside gradient
    accumulation (``val_check_interval`` not a multiple of ``accumulate_grad_batches``) is saved after the step
    that completes it. A checkpoint written between the micro-batches of a step would count them as trained,
    though their gradients are not in it: the resumed run would skip them. Training that stops between them (a
    callback's ``should_stop``) leaves last.ckpt at the step before, with a warning.

    A ``Checkpoint`` callback, so Lightning runs it in the checkpoint group, in list order: placed after the
    best-k and recent ModelCheckpoints, the copy written after a validation also holds their newest
    bookkeeping, so a run resumed from it keeps ranking checkpoints correctly. (Lightning's own
    ``save_last`` writes only when a top-k checkpoint is written, or once at the end of training.)
    ``ckpt_path=last`` finds the file through the ModelCheckpoint that shares the directory.
    """

    def __init__(self, dirpath, every_n_train_steps: int | None = None):
        self.path = Path(dirpath) / run_files.LAST
        self.every_n_train_steps = every_n_train_steps
        self.saved_step = None
        self._step = None  # global_step when the training batch in progress started
        self.between_steps = False  # the last training batch did not step the optimizer
        self._pending = False  # a validation inside accumulation: save after the step that completes it

    def save(self, trainer) -> None:
        # every rank calls it; rank 0 writes (atomically, see checkpoint.py). The full state, for resuming: said,
        # so Lightning does not log that `weights_only` was not set (it is about what is saved, not how it is read)
        trainer.save_checkpoint(self.path, weights_only=False)
        self.saved_step, self._pending = trainer.global_step, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n, step = self.every_n_train_steps, trainer.global_step
        self.between_steps = step == self._step
        if self.between_steps or step == self.saved_step:
            return
        # Right after the optimizer step; and where training stops after this batch (max_steps, a time limit: a
        # callback's should_stop), here: a checkpoint written in on_train_end counts the epoch as completed, and the
        # run resumed (or extended) from it would skip the rest of that epoch.
        stopping = trainer.should_stop or 0 <= trainer.max_steps <= step
        if self._pending or stopping or (n and step % n == 0):
            self.save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            if self.between_steps:
                self._pending = True
            else:
                self.save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.between_steps:
            log.warning("training stopped between the micro-batches of optimizer step %d: %s stays at step %s, "
                        "which a resume repeats them from", trainer.global_step + 1, self.path, self.saved_step)
        elif trainer.global_step != self.saved_step:
            self.save(trainer)


class StepBoundaryTimer(Timer):
    """``trainer.max_time``, stopping on an optimizer step's boundary. Lightning's own Timer (what
    ``Trainer(max_time=...)`` adds) stops after any training batch: inside gradient accumulation the
    micro-batches since the last optimizer step are thrown away, and the last.ckpt written at the stop counts
    them as trained, so that the resumed run skips them. This one checks the time after the batches that step
    the optimizer only (the last batch of an epoch always does). The app builds it from trainer.max_time."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, *args, **kwargs) -> None:
        if trainer.global_step != getattr(self, "_step", None):
            super().on_train_batch_end(trainer, *args, **kwargs)


class TokenProgressBar(TQDMProgressBar):
    """The training bar shows loss, learning rate, target tokens/s (all ranks) and the run's ETA.

    It refreshes on the optimizer steps that log (every ``trainer.log_every_n_steps``), never in between:
    reading the metrics copies them to the host, which would make every step wait for the device.
    The ETA covers the whole run, not the epoch: remaining optimizer steps (``max_steps``, or
    ``max_epochs`` worth of batches) times the mean time per step since this process started training,
    or the time ``max_time`` leaves, whichever ends the run first.
    """

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._start = (time.perf_counter(), trainer.global_step)
        self._shown_step = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step  # optimizer steps done; the step just taken logged if it is a multiple
        every = trainer.log_every_n_steps
        if self.train_progress_bar is None or not every or step % every or step == self._shown_step:
            return
        self._shown_step = step
        self.train_progress_bar.n = batch_idx + 1
        self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))  # also redraws the bar

    def get_metrics(self, trainer, pl_module) -> dict:
        shown = {}
        metrics = trainer.callback_metrics
        for key, label, fmt in (("train/loss", "loss", "{:.3f}"), ("train/lr", "lr", "{:.2e}"),
                                ("train/tgt_tokens_per_sec", "tok/s", "{:,.0f}"), ("val/bleu", "bleu", "{:.2f}")):
            if key in metrics:
                shown[label] = fmt.format(float(metrics[key]))
        eta = self.eta_seconds(trainer)
        if eta is not None:
            shown["eta"] = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta < 86400 else f"{eta / 86400:.1f}d"
        return shown

    def eta_seconds(self, trainer) -> float | None:
        start = getattr(self, "_start", None)
        if start is None or trainer.global_step <= start[1]:
            return None
        seconds_per_step = (time.perf_counter() - start[0]) / (trainer.global_step - start[1])
        limits = []  # optimizer steps at which the run ends, by max_steps and by max_epochs
        if trainer.max_steps is not None and trainer.max_steps >= 0:
            limits.append(trainer.max_steps)
        batches = trainer.num_training_batches
        if trainer.max_epochs is not None and trainer.max_epochs >= 0 and math.isfinite(batches):
            limits.append(trainer.max_epochs * math.ceil(batches / trainer.accumulate_grad_batches))
        etas = [max(min(limits) - trainer.global_step, 0) * seconds_per_step] if limits else []
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)  # there when max_time is set
        remaining = timer.time_remaining() if timer is not None else None
        if remaining is not None:
            etas.append(max(remaining, 0.0))
        return min(etas) if etas else None


# --- what conf/callbacks/default.yaml builds: each from the options it interpolates, None where that option is off


def monitors() -> tuple[str, ...]:
    """What ``checkpoint.monitor`` may name: auto, val_loss, and val_NAME for every registered metric."""
    return ("auto", "val_loss", *(f"val_{name}" for name in catalog.names()))


MONITORS = monitors()


def monitored(monitor: str, val_bleu_max_sentences: int | None) -> tuple[str, str]:
    """(logged metric, mode) that ``checkpoint.monitor`` names: val_NAME -> ("val/NAME", the metric's direction:
    "max" for val_bleu, "min" for val_ter), val_NAME/PAIR -> that of one direction (data.pairs: "val/NAME/PAIR"),
    val_loss -> ("val/loss", "min"), auto -> val_bleu unless validation metrics are off (``val_bleu_max_sentences``
    0)."""
    base, _, pair = monitor.partition("/")  # data.pairs: one direction's value, val_bleu/en-de
    if base not in monitors() or (pair and base in ("auto", "val_loss")) or monitor.endswith("/"):
        raise ValueError(f"checkpoint.monitor={monitor!r}: use one of {monitors()}, or val_NAME/PAIR (data.pairs)")
    if base == "auto":
        base = "val_bleu" if val_bleu_max_sentences != 0 else "val_loss"
    if base == "val_loss":
        return "val/loss", "min"
    name = base.removeprefix("val_")
    if val_bleu_max_sentences == 0:
        shown = "BLEU" if name == "bleu" else name
        raise ValueError(f"checkpoint.monitor={monitor} needs val {shown}: train.val_bleu_max_sentences is 0 (set N, "
                         f"or null for the whole validation set)")
    return f"val/{name}" + (f"/{pair}" if pair else ""), catalog.mode(name, "checkpoint.monitor")


def monitored_metric(monitor: str, val_bleu_max_sentences: int | None) -> str | None:
    """The registered metric's name that ``checkpoint.monitor`` ranks by (validation computes it); None for
    val_loss."""
    metric, _ = monitored(monitor, val_bleu_max_sentences)
    return None if metric == "val/loss" else metric.split("/")[1]


def best_checkpoint(dirpath, save_top_k: int, val_bleu_max_sentences: int | None,
                    monitor: str = "auto") -> ModelCheckpoint:
    """The best-k checkpoints by the ``monitor``ed metric (``monitored``), named for it: step0001000-bleu27.31.ckpt,
    step0001000-comet0.8123.ckpt, step0001000-loss2.345.ckpt. The first ModelCheckpoint of the run:
    ``trainer.test(ckpt_path="best")`` tests its best."""
    metric, mode = monitored(monitor, val_bleu_max_sentences)
    name = metric.removeprefix("val/")
    digits = 3 if name == "loss" else catalog.metric_class(name).digits
    return ModelCheckpoint(
        dirpath=dirpath, filename=f"step{{step:07d}}-{name}{{{metric}:.{digits}f}}",
        auto_insert_metric_name=False, monitor=metric, mode=mode, save_top_k=save_top_k, save_last=False)


def early_stopping(patience: int | None, monitor: str, val_bleu_max_sentences: int | None) -> EarlyStopping | None:
    """Lightning's EarlyStopping on the ``monitor``ed metric, in its direction: stop after ``patience`` validations
    without a better value; None when ``patience`` is null."""
    metric, mode = monitored(monitor, val_bleu_max_sentences)  # checked even when off: the best-k use it too
    if patience is None:
        return None
    if patience < 1:
        raise ValueError(f"checkpoint.patience={patience}: give validations >= 1, or null (never stop early)")
    return EarlyStopping(monitor=metric, mode=mode, patience=patience, check_on_train_epoch_end=False)


def recent_checkpoints(dirpath, keep: int, every_n_train_steps: int | None = None,
                       every_n_minutes: float | None = None) -> ModelCheckpoint | None:
    """A rolling window of the newest ``keep`` checkpoints, for checkpoint averaging (paper section 6.1): one every
    N optimizer steps or M minutes, or, with neither, after every validation; None when ``keep`` is 0."""
    if not keep:
        return None
    return ModelCheckpoint(dirpath=dirpath, filename="step{step:07d}", auto_insert_metric_name=False, monitor="step",
                           mode="max", save_top_k=keep, save_last=False, every_n_train_steps=every_n_train_steps,
                           train_time_interval=timedelta(minutes=every_n_minutes) if every_n_minutes else None)


def attention_maps(every_n_validations: int, n_probes: int, probes: list | None,
                   max_tokens: int, per_pair: bool = False) -> AttentionMaps | None:
    """``AttentionMaps``, or None when ``every_n_validations`` is 0 (``per_pair``: absent from the configs of runs
    made before it, which drew one group)."""
    if not every_n_validations:
        return None
    return AttentionMaps(every_n_validations=every_n_validations, n_probes=n_probes, probes=probes or None,
                         max_tokens=max_tokens, per_pair=per_pair)


def progress_bar(enabled: bool = True) -> TokenProgressBar | None:
    """``TokenProgressBar`` where the trainer shows a bar (trainer.enable_progress_bar), else None."""
    return TokenProgressBar() if enabled else None


class RecordFingerprint(Callback):
    """Writes the run's fingerprint and overrides into every checkpoint it saves (keys ``run_fingerprint``,
    ``run_overrides``); the fingerprint is the Trainer's (its world size and precision), taken at set-up."""

    def __init__(self, cfg: DictConfig, overrides: list[str]):
        self.cfg, self.overrides = cfg, overrides
        self.fingerprint = None
        self.recorded_run = None  # the resumed checkpoint's fingerprint, where init_from's file is gone (app sets it)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.fingerprint = run_fingerprint(self.cfg, trainer, self.recorded_run)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[CKPT_FINGERPRINT] = self.fingerprint if self.fingerprint is not None else run_fingerprint(
            self.cfg, trainer)
        checkpoint[CKPT_OVERRIDES] = self.overrides
