"""Callbacks: per-head attention maps in TensorBoard, ``last.ckpt`` after every validation, and a
progress bar with tokens/s and ETA.

(Atomic checkpoint writing is a CheckpointIO plugin, in checkpoint.py.)
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint, TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

ATTENTION_KINDS = {"encoder": "encoder-self", "decoder": "decoder-self", "cross": "cross"}  # model key -> tag


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention distributions. weights (B, h, Lq, Lk) -> (h,)."""
    p = weights.float()
    per_query = -(p * torch.log(p.clamp_min(1e-12))).sum(dim=-1)  # (B, h, Lq)
    return per_query.mean(dim=(0, 2))  # (h,)


def render_heatmaps(panels: list[tuple[np.ndarray, list[str], list[str]]], title: str,
                    panel_inches: float = 4.0, dpi: int = 96) -> np.ndarray:
    """One figure, one panel per probe sentence: (weights (Lq, Lk), key tokens, query tokens).

    Returns the image as uint8 (3, H, W) with H = panel_inches * dpi and W = H * len(panels), whatever
    the sentence lengths, so that TensorBoard shows maps of one tag at one size.
    """
    fig = Figure(figsize=(panel_inches * len(panels), panel_inches), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    for i, (weights, keys, queries) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        # Colour scale per panel, 0 to the largest weight: diffuse heads stay readable.
        ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6),
                  interpolation="nearest", aspect="auto")
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
        ax.set_yticks(range(len(queries)), queries, fontsize=6)
        ax.tick_params(length=0, pad=1)
    fig.suptitle(title, fontsize=8)
    fig.subplots_adjust(left=0.16 / len(panels), right=0.99, bottom=0.2, top=0.93, wspace=0.3)
    canvas.draw()
    rgb = np.asarray(canvas.buffer_rgba())[..., :3]  # (H, W, 3)
    return np.ascontiguousarray(rgb.transpose(2, 0, 1))  # (3, H, W)


class AttentionMaps(Callback):
    """Every ``every_n_validations`` validations, run fixed probe sentences through the model and log,
    for every (kind, layer, head), a heatmap under ``attention/{kind}/layer_{l}/head_{h}`` and the
    head's mean attention entropy under ``attention_entropy/{kind}/layer_{l}/head_{h}``; kind is
    encoder-self, decoder-self or cross (paper section 3.2.3; compare its figures 3-5).

    ``probes``: a list of ``[source, target]`` pairs (the decoder is teacher-forced with the target)
    or of source strings (the target is the model's greedy translation). Default: the first
    ``n_probes`` pairs of the validation split. Sentences are cut to ``max_tokens`` subwords.
    """

    def __init__(self, every_n_validations: int = 1, probes: list | None = None, n_probes: int = 2,
                 max_tokens: int = 32, panel_inches: float = 4.0, dpi: int = 96):
        if every_n_validations < 1:
            raise ValueError(f"callbacks.attention_maps.every_n_validations must be >= 1, got {every_n_validations}")
        self.every_n_validations = every_n_validations
        self.probes = [p if isinstance(p, str) else tuple(p) for p in probes] if probes else None
        self.n_probes, self.max_tokens = n_probes, max_tokens
        self.panel_inches, self.dpi = panel_inches, dpi
        self.validations = 0

    def state_dict(self) -> dict:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict) -> None:
        self.validations = state_dict["validations"]

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
        was_training = pl_module.training
        pl_module.eval()
        try:
            self.log_maps(writer, pl_module.model, pl_module.tokenizer, self._probe_pairs(trainer), trainer.global_step)
        finally:
            pl_module.train(was_training)

    def _probe_pairs(self, trainer) -> list:
        if self.probes is not None:
            return self.probes
        datamodule = trainer.datamodule
        sources, targets = datamodule.sources("val"), datamodule.references("val")
        return list(zip(sources[: self.n_probes], targets[: self.n_probes]))

    @torch.no_grad()
    def log_maps(self, writer, model, tokenizer, probes: list, step: int) -> None:
        """Log one heatmap and one entropy scalar per (kind, layer, head) for ``probes``."""
        from transformer_nmt.decoding import greedy_decode

        device = next(model.parameters()).device
        panels = {}  # (kind, layer) -> list over probes of (weights (h, Lq, Lk), key pieces, query pieces)
        for probe in probes:
            source, target = (probe, None) if isinstance(probe, str) else probe
            src = tokenizer.encode(source)[: self.max_tokens - 1] + [tokenizer.eos_id]
            src_t = torch.tensor([src], device=device)  # (1, S)
            tgt_ids = tokenizer.encode(target) if target is not None else greedy_decode(
                model, src_t, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)[0]
            tgt_in = [tokenizer.bos_id] + tgt_ids[: self.max_tokens - 1]
            _, attention = model(src_t, torch.tensor([tgt_in], device=device), return_attention=True)
            src_pieces = [tokenizer.id_to_piece(i) for i in src]
            tgt_pieces = [tokenizer.id_to_piece(i) for i in tgt_in]
            keys = {"encoder": src_pieces, "decoder": tgt_pieces, "cross": src_pieces}
            queries = {"encoder": src_pieces, "decoder": tgt_pieces, "cross": tgt_pieces}
            for kind, layers in attention.items():
                for layer, weights in enumerate(layers):  # weights (1, h, Lq, Lk)
                    panels.setdefault((kind, layer), []).append((weights[0].float().cpu(), keys[kind], queries[kind]))
        for (kind, layer), per_probe in panels.items():
            tag_kind = ATTENTION_KINDS[kind]
            entropy = torch.stack([attention_entropy(w[None]) for w, _, _ in per_probe]).mean(dim=0)  # (h,)
            for head in range(per_probe[0][0].shape[0]):
                name = f"{tag_kind}/layer_{layer}/head_{head}"
                image = render_heatmaps([(w[head].numpy(), k, q) for w, k, q in per_probe],
                                        f"{tag_kind} layer {layer} head {head}", self.panel_inches, self.dpi)
                writer.add_image(f"attention/{name}", image, step, dataformats="CHW")
                writer.add_scalar(f"attention_entropy/{name}", float(entropy[head]), step)
        writer.flush()


class LastCheckpoint(Checkpoint):
    """``RUN_DIR/checkpoints/last.ckpt``: after every validation, every ``every_n_train_steps`` optimizer
    steps (None: not by steps; set it for mid-epoch resume) and at the end of training.

    A ``Checkpoint`` callback, so Lightning runs it in the checkpoint group, in list order: placed after the
    best-k and recent ModelCheckpoints, the copy written after a validation also holds their newest
    bookkeeping, so a run resumed from it keeps ranking checkpoints correctly. (Lightning's own
    ``save_last`` writes only when a top-k checkpoint is written, or once at the end of training.)
    ``ckpt_path=last`` finds the file through the ModelCheckpoint that shares the directory.
    """

    def __init__(self, dirpath, every_n_train_steps: int | None = None):
        self.path = Path(dirpath) / "last.ckpt"
        self.every_n_train_steps = every_n_train_steps
        self.saved_step = None

    def save(self, trainer) -> None:
        trainer.save_checkpoint(self.path)  # every rank calls it; rank 0 writes (atomically, see checkpoint.py)
        self.saved_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n, step = self.every_n_train_steps, trainer.global_step
        if n and step % n == 0 and step != self.saved_step:  # right after the optimizer step that reached it
            self.save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_step != self.saved_step:
            self.save(trainer)


class TokenProgressBar(TQDMProgressBar):
    """The training bar shows loss, learning rate, target tokens/s (all ranks) and the run's ETA.

    It refreshes on the optimizer steps that log (every ``trainer.log_every_n_steps``), never in between:
    reading the metrics copies them to the host, which would make every step wait for the device.
    The ETA covers the whole run, not the epoch: remaining optimizer steps (``max_steps``, or
    ``max_epochs`` worth of batches) times the mean time per step since this process started training.
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
        if not limits:
            return None
        return max(min(limits) - trainer.global_step, 0) * seconds_per_step
