"""Training: the loss (paper section 5.4), the optimizer and its schedule (5.3), and the
LightningModule that ties them to a ``Transformer``.

The ``Transformer`` it wraps is a plain ``nn.Module``; everything Lightning-specific lives here:
one training step is teacher-forced cross-entropy with label smoothing over the non-padding target
tokens; validation adds greedy-decoded corpus metrics (``train.val_metrics``, registered in metrics/: BLEU by
default, COMET and others on request) over the first ``val_bleu_max_sentences`` sentences of the split, gathered
from every DDP rank. With several validation sets
(``data.val=[A,B]``) each is scored and logged under its own name (``val/``, ``val_NAME/``: DataConfig.val_splits).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import asdict
from functools import partial

import lightning.pytorch as pl
import torch
from torch import Tensor

from transformer_nmt import __version__
from transformer_nmt.checkpoint import (
    CKPT_DATA_CONFIG,
    CKPT_MODEL_CONFIG,
    CKPT_RUN,
    CKPT_TOKENIZER,
    CKPT_VERSION,
    checkpoint_tokenizer,
    tokenizer_entries,
)
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.language_tags import LanguageTags
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.strategies import SearchBatch, generate
from transformer_nmt.metrics import catalog
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.ema import WeightEMA, check_decay, take_average, take_trained
from transformer_nmt.training.freezing import freeze
from transformer_nmt.training.lightning_adapter import is_logging_step

VALIDATION_DECODE = DecodeConfig(strategy="greedy", beam=1)  # validation BLEU: greedy, through generation/
LOSS_SCALE_TOKENS = 1000.0  # backward runs on (summed token loss) / this; see training_step

log = logging.getLogger(__name__)


# Logits per chunk of the loss, so that its fp32 temporaries stay the same size whatever the batch. On a GPU, 128 MiB
# (few kernel launches); on CPU 4 MiB, which stays in cache through the chunk's passes (measured: docs/benchmarks.md,
# "Dropout masks and loss chunks").
LOSS_CHUNK_ELEMENTS = 2 ** 25
LOSS_CHUNK_ELEMENTS_CPU = 2 ** 20


class NonFiniteError(RuntimeError):
    """Training met a loss or gradient that is not finite (NaN or inf); the message names the optimizer step and
    the last finite checkpoint."""


def loss_chunk_elements(device_type: str) -> int:
    """Logits per chunk of the loss on ``device_type`` ("cpu", "cuda", ...)."""
    return LOSS_CHUNK_ELEMENTS_CPU if device_type == "cpu" else LOSS_CHUNK_ELEMENTS


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy summed over the non-pad rows, computed in fp32 over chunks of rows.

    Per row with log-probabilities l = log_softmax(x) and label y: loss = (1 - eps) * (-l_y) + eps * (-mean_j l_j),
    nll = -l_y. Nothing but the logits is kept for the backward pass, which recomputes softmax chunk by chunk:
    d loss / d x_j = softmax(x)_j - (1 - eps) * [j = y] - eps / V, times [y != pad]. No (N, V) buffer is made
    besides the logits themselves, one fp32 chunk, and, unless ``overwrite`` lets the gradient take their place,
    their gradient.

    Both passes use torch's fused (vectorized, one pass per row) log_softmax and softmax kernels, in fp32
    whatever the logits' dtype (``dtype=torch.float32``), rather than log-sum-exp written out (max, subtract,
    exp, sum: a temporary per step): faster, same values (tests/test_training.py; measured in docs/benchmarks.md,
    "The training step against the matmul ceiling").
    """

    @staticmethod
    def forward(ctx, logits, labels, epsilon: float, pad_id: int, overwrite: bool, rows: int):
        # logits (N, V) in the compute dtype, labels (N,); ``rows`` per chunk
        n, vocab = logits.shape
        keep = (labels != pad_id).float()  # (N,): 1 for a real target token, 0 for padding
        sums = torch.zeros(2, dtype=torch.float32, device=logits.device)  # (smoothed loss, nll)
        with torch.autocast(logits.device.type, enabled=False):
            for start in range(0, n, rows):
                chunk = slice(start, start + rows)
                log_probs = torch.log_softmax(logits[chunk], dim=-1, dtype=torch.float32)  # (n_c, V)
                nll = -log_probs.gather(-1, labels[chunk, None]).squeeze(-1)  # (n_c,)
                smoothed = (1.0 - epsilon) * nll - epsilon * log_probs.mean(dim=-1)  # (n_c,)
                sums += torch.stack([smoothed, nll]) @ keep[chunk]  # masked sums: no boolean indexing
        ctx.save_for_backward(logits, labels, keep)
        ctx.epsilon, ctx.overwrite, ctx.rows = epsilon, overwrite, rows
        loss, nll = sums.unbind()
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        logits, labels, keep = ctx.saved_tensors
        n, vocab = logits.shape
        eps = ctx.epsilon
        grad = logits if ctx.overwrite else torch.empty_like(logits)  # (N, V)
        rows = ctx.rows
        with torch.autocast(logits.device.type, enabled=False):
            for start in range(0, n, rows):
                chunk = slice(start, start + rows)
                g = torch.softmax(logits[chunk], dim=-1, dtype=torch.float32)  # (n_c, V)
                g -= eps / vocab
                g.scatter_add_(-1, labels[chunk, None], g.new_full((g.shape[0], 1), eps - 1.0))
                g *= (keep[chunk] * grad_loss)[:, None]
                grad[chunk] = g
        return grad, None, None, None, None, None


def label_smoothed_cross_entropy(logits: Tensor, labels: Tensor, epsilon: float, pad_id: int,
                                 overwrite_logits: bool = False,
                                 chunk_elements: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Section 5.4: cross-entropy against q = (1 - epsilon) * one_hot(label) + epsilon / V.

    This is the uniform label smoothing of Szegedy et al. (2016), which the paper cites, and equals
    ``F.cross_entropy(..., label_smoothing=epsilon, ignore_index=pad_id, reduction="sum")``.
    logits (B, T, V), labels (B, T) -> (smoothed loss summed over non-pad tokens, plain NLL summed over
    the same tokens (for perplexity; not differentiable), number of those tokens); all scalars on the logits'
    device, the sums computed in float32 in chunks of rows, so that at the paper's batch (25k tokens x 37k
    vocabulary) no float32 copy of the logits or of the log-probabilities is ever held. With
    ``overwrite_logits`` the backward pass writes the gradient into the logits' memory: pass it when the
    logits feed nothing but this loss (the training step), and the loss holds no (tokens x V) buffer of its own.
    ``chunk_elements``: logits per chunk (None: ``loss_chunk_elements`` of the logits' device); the values do
    not depend on it beyond fp32 rounding of the sums.
    """
    vocab = logits.shape[-1]
    if chunk_elements is None:
        chunk_elements = loss_chunk_elements(logits.device.type)
    elif chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    rows = max(1, chunk_elements // vocab)
    loss, nll = _SmoothedCrossEntropy.apply(logits.reshape(-1, vocab), labels.reshape(-1), epsilon, pad_id,
                                            overwrite_logits, rows)
    return loss, nll, (labels != pad_id).sum()


def unscale_for_fused_step(trainer, optimizer) -> None:
    """Under a gradient scaler (16-mixed), unscale the gradients of an optimizer that would unscale them inside its
    own step (fused Adam: ``_step_supports_amp_scaling``), so that what reads them before the step (clipping,
    ``train/grad_norm``, the non-finite check) sees the true gradients.

    Lightning unscales before ``on_before_optimizer_step`` only for optimizers that do not; a fused one would be
    clipped and logged at the loss scale (2^16 times too large), and then divided by that scale in its step: clipping
    at ``train.clip_grad_norm`` would shrink the update by the scale. Once unscaled here, the scaler's step passes the
    optimizer its inf check and no scale (torch.amp.GradScaler.step: the stage is UNSCALED), and skips an overflowed
    step as before. No host sync (the unscale and its inf check stay on the device)."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    if scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
        scaler.unscale_(optimizer)


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


def peak_lr(optim: dict, d_model: int) -> float:
    """The schedule's peak (at step warmup_steps): ``train.lr`` where given, else 5.3's factor * (d_model *
    warmup)^-0.5."""
    if optim.get("lr") is not None:
        return float(optim["lr"])
    return inverse_sqrt_lr(max(optim["warmup_steps"], 1), d_model, max(optim["warmup_steps"], 1), optim["lr_factor"])


def _scheduler_factor(scheduler_step: int, d_model: int, warmup_steps: int, factor: float,
                      peak: float | None = None, init: float = 0.0, schedule: str = "inverse_sqrt") -> float:
    # LambdaLR's step counter is 0 before the first optimizer step; the paper counts from 1.
    if schedule == "inverse_sqrt" and peak is None and init == 0.0:
        return inverse_sqrt_lr(scheduler_step + 1, d_model, warmup_steps, factor)  # the paper's, as written
    if peak is None:  # 5.3's peak (a constant schedule may have no warm-up: its peak at step 1 then)
        peak = inverse_sqrt_lr(max(warmup_steps, 1), d_model, max(warmup_steps, 1), factor)
    lr = warmup_constant_lr if schedule == "constant" else warmup_inverse_sqrt_lr
    return lr(scheduler_step + 1, peak, warmup_steps, init)


def dropout_seed(seed: int, rank: int, global_step: int, batch_idx: int) -> int:
    """The seed of the dropout masks of one micro-batch: a pure function of where training is.

    Seeding every micro-batch from (seed, rank, optimizer step, batch index) instead of carrying one
    generator through the run makes a resumed run draw the same masks as an uninterrupted one, however
    many random numbers data loading or validation consumed in between; ranks draw different masks.
    """
    return hash((seed, rank, global_step, batch_idx)) & 0x7FFF_FFFF_FFFF_FFFF


def first_non_finite(tensors: dict[str, Tensor]) -> str | None:
    """The name of the first floating-point tensor of ``tensors`` holding NaN or inf, None where all are finite
    (one host read when they are: a single reduction over all of them)."""
    weights = {name: value for name, value in tensors.items() if value.is_floating_point()}
    if not weights or torch.stack([torch.isfinite(value).all() for value in weights.values()]).all():
        return None
    return next(name for name, value in weights.items() if not torch.isfinite(value).all())


class TranslationModule(pl.LightningModule):
    """Trains a ``Transformer`` with the paper's recipe (sections 5.3, 5.4); logs loss, perplexity,
    learning rate, gradient norm, throughput, and validation BLEU.

    ``model_config``: TransformerConfig fields, vocab_size included; ``train_config``: fields of
    ``TrainConfig`` (training/config.py; missing ones take its default, unknown ones are a TypeError). Both
    are plain dicts, so checkpoints stay loadable with ``torch.load(weights_only=True)``. ``tokenizer``
    decodes hypotheses for BLEU and is embedded in every checkpoint, as is ``data_config`` (so that
    ``evaluate`` can find the test split); ``seed`` drives the dropout masks (``dropout_seed``). ``metric_options``:
    the metrics' settings (``metric.*``, a plain dict of ``catalog.MetricOptions``), not saved in checkpoints.
    """

    def __init__(self, model_config: dict, train_config: dict | None = None, tokenizer: Tokenizer | None = None,
                 seed: int = 0, data_config: dict | None = None, metric_options: dict | None = None):
        super().__init__()
        # plain containers only; the metrics' settings (a COMET directory) are the evaluating machine's, not the model's
        self.save_hyperparameters(ignore=["tokenizer", "data_config", "metric_options"])
        self.data_config = data_config
        self.model = Transformer(TransformerConfig(**model_config))
        self.tokenizer = tokenizer
        self.optim = asdict(TrainConfig(**(train_config or {})))
        self.parameter_counts = freeze(self.model, self.optim["freeze"])  # train.freeze: requires_grad=False
        if self.optim["lr_schedule"] not in LR_SCHEDULES:
            raise ValueError(f"train.lr_schedule={self.optim['lr_schedule']!r}: use one of {', '.join(LR_SCHEDULES)}")
        if self.optim["warmup_steps"] < (1 if self.optim["lr_schedule"] == "inverse_sqrt" else 0):
            raise ValueError(f"train.warmup_steps={self.optim['warmup_steps']}: the inverse square root schedule "
                             f"peaks at step warmup_steps (>= 1); for no warm-up use train.lr_schedule=constant "
                             f"train.warmup_steps=0")
        if self.optim["ema_decay"] is not None:
            check_decay(self.optim["ema_decay"])  # refused here, before the fit, not at its start
        self.ema = None  # WeightEMA, made at the fit's start, on the training device (train.ema_decay)
        self._ema_resumed = None  # (average, updates) a resumed checkpoint holds, until the fit starts
        if self.optim["compile"]:
            self.model.compile()  # compiles forward in place: parameter names and checkpoints stay as they are
        self.seed = seed
        self.bleu_limits = {"val": self.optim["val_bleu_max_sentences"], "test": self.optim["test_bleu_max_sentences"]}
        options = catalog.read_options(metric_options)
        self.metrics = [catalog.build(name, options, (data_config or {}).get("tgt_lang"), "train.val_metrics")
                        for name in catalog.check_names(self.optim["val_metrics"], "train.val_metrics")]
        # The validation sets' names, in the order of the datamodule's loaders (dataloader_idx).
        self.val_splits = (DataConfig.from_record(data_config, "data config").val_splits()
                           if data_config and data_config.get("val") else ["val"])
        tags = LanguageTags.of(data_config)
        self._decoder_tags = tags is not None and tags.style == "decoder"  # validation forces each target's tag
        self._step_sums = None  # (4,) float64 on the device: source tokens, target tokens, loss sum, nll sum
        self._first_bad_step = None  # () int64 on the device: the first optimizer step not finite (-1: none yet)
        self._step_started = None  # time.perf_counter() at the last optimizer step
        self._timed = {"tokens": 0, "seconds": 0.0}  # (source, target) tokens and seconds over the timed steps
        self._interval = {"tokens": 0, "seconds": 0.0}  # the same since the last logging step
        self._eval = {}  # per evaluation: split -> loss sums and decoded sentences
        self.hypotheses = {}  # split -> {sentence index: detokenized greedy hypothesis} of its last evaluation
        self.validated_at_step = None  # the optimizer step of the last validation
        # This training run's identity: new at a fresh start, the checkpoint's own when one is restored (resume)
        self.training_run = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"

    # --- optimisation ------------------------------------------------------------------------
    def configure_optimizers(self):
        """Section 5.3: Adam(beta1 0.9, beta2 0.98, eps 1e-9), lr from ``inverse_sqrt_lr`` per optimizer step."""
        o = self.optim
        fused = True if o["fused_adam"] and self.device.type == "cuda" else None  # None: torch's default
        trainable = [p for p in self.parameters() if p.requires_grad]  # frozen ones (train.freeze): no Adam state
        optimizer = torch.optim.Adam(trainable, lr=1.0, betas=tuple(o["betas"]), eps=o["eps"], fused=fused)
        schedule = partial(_scheduler_factor, d_model=self.model.config.d_model, warmup_steps=o["warmup_steps"],
                           factor=o["lr_factor"], peak=o["lr"], init=o["warmup_init_lr"], schedule=o["lr_schedule"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        # interval "step": Lightning steps it once per optimizer step, i.e. after accumulation.
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_fit_start(self):
        """train.ema_decay: the average starts at the weights the fit starts from, or continues a resumed one."""
        if self.optim["ema_decay"] is None:
            return
        self.ema = WeightEMA(self, self.optim["ema_decay"], self.optim["ema_warmup"])  # names as in state_dict
        if self._ema_resumed is not None:
            self.ema.restore(*self._ema_resumed, source="the resumed checkpoint")
            self._ema_resumed = None

    def on_train_end(self):
        """The end of the fit: a non-finite step that no logging step or save has read yet (logging every 100 steps,
        no checkpoint callback) stops the run here, as do weights that are not finite, before a validation, the
        test or results.json reads them (one host read, once per fit)."""
        self.check_finite()
        bad = first_non_finite(dict(self.named_parameters()))
        if bad is not None:
            raise NonFiniteError(f"training stopped: after optimizer step {self.global_step} the weights are not "
                                 f"finite ({bad} holds NaN or inf); no results are written")

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        if self.ema is not None:
            self.ema.update()  # after every optimizer step (not micro-batch); no host sync

    def on_train_batch_start(self, batch, batch_idx):
        torch.manual_seed(dropout_seed(self.seed, self.global_rank, self.global_step, batch_idx))

    def training_step(self, batch, batch_idx):
        src, tgt = batch["src"], batch["tgt"]  # (B, S), (B, T)
        tgt_in, labels = tgt[:, :-1], tgt[:, 1:]  # teacher forcing: predict token t+1 from tokens <= t
        logits = self.model(src, tgt_in)  # (B, T-1, V)
        pad = self.model.config.pad_id
        # The logits feed nothing but the loss: their memory can take their gradient (see the loss).
        loss_sum, nll_sum, n_tokens = label_smoothed_cross_entropy(logits, labels, self.optim["label_smoothing"], pad,
                                                                   overwrite_logits=True)
        # (source tokens, target tokens, loss sum, nll sum): summed on the device, read only when logged.
        sums = torch.stack([(src != pad).sum(), n_tokens, loss_sum.detach(), nll_sum.detach()]).double()
        self._step_sums = sums if self._step_sums is None else self._step_sums + sums
        # Every token of an optimizer step weighs the same, whatever the micro-batch it came in: backward
        # runs on the loss summed over tokens (over a fixed LOSS_SCALE_TOKENS, to keep fp16 magnitudes
        # ordinary), and on_before_optimizer_step turns the summed gradients into the per-token mean.
        return loss_sum / LOSS_SCALE_TOKENS

    def on_before_optimizer_step(self, optimizer):
        """Once per optimizer step, after gradients are all-reduced (and unscaled under 16-mixed).

        Nothing here waits for the device: the step's sums are reduced over ranks with an asynchronous
        all-reduce, the gradients are rescaled by a device tensor, and metrics are logged only on
        ``trainer.log_every_n_steps`` boundaries, where reading them is the point."""
        unscale_for_fused_step(self.trainer, optimizer)
        sums = self._step_sums
        if self.trainer.world_size > 1:  # not strategy.reduce: Lightning puts a barrier (a host sync) before it
            torch.distributed.all_reduce(sums)
        tokens = sums[1].clamp(min=1)
        # Lightning divided each micro-batch's loss by accumulate_grad_batches and DDP averaged the ranks:
        # undo both and divide by the step's target tokens -> gradient of the per-token mean loss.
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        scale = self.trainer.accumulate_grad_batches * self.trainer.world_size * LOSS_SCALE_TOKENS
        torch._foreach_mul_(grads, (scale / tokens).float())
        clip = self.optim.get("clip_grad_norm")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm=clip if clip else math.inf)
        self._note_non_finite(sums, grad_norm)
        now = time.perf_counter()
        if self._step_started is not None:  # timed: not the first step of the fit or after a validation
            seconds = now - self._step_started
            self._timed["tokens"] = self._timed["tokens"] + sums[:2]
            self._timed["seconds"] += seconds
            self._interval["tokens"] = self._interval["tokens"] + sums[:2]
            self._interval["seconds"] += seconds
        if is_logging_step(self.trainer):  # Lightning's own rule for a logging step
            self.check_finite()  # before the optimizer applies this step: its values are read here anyway
            self._log_step(optimizer, sums, grad_norm)
        self._step_sums = None
        self._step_started = now

    def _note_non_finite(self, sums: Tensor, grad_norm: Tensor) -> None:
        """Remember, on the device (no host sync), the first optimizer step whose loss or gradient norm is not
        finite. Under a gradient scaler (16-mixed) an inf gradient is the scaler's overflow, whose step it skips
        (lowering the scale): only the loss counts there."""
        bad = ~torch.isfinite(sums[2:]).all()
        if getattr(self.trainer.precision_plugin, "scaler", None) is None:
            bad = bad | ~torch.isfinite(grad_norm)
        if self._first_bad_step is None:
            self._first_bad_step = torch.full((), -1, dtype=torch.long, device=sums.device)
        # global_step: the optimizer steps taken; this one is global_step + 1
        self._first_bad_step.masked_fill_(bad & (self._first_bad_step < 0), self.global_step + 1)

    def check_finite(self) -> None:
        """``NonFiniteError`` if an optimizer step of this fit had a loss or gradient that is not finite (one host
        read of a device scalar: where values are read anyway, a logging step or a checkpoint's save). It names
        the step, and the last checkpoint written, which holds finite weights (every save checks them)."""
        if self._first_bad_step is None:
            return
        step = int(self._first_bad_step)
        if step < 0:
            return
        last = next((c for c in self.trainer.callbacks if hasattr(c, "saved_step") and hasattr(c, "path")), None)
        kept = (f"the last checkpoint, {last.path} (step {last.saved_step}), holds finite weights: resume from it "
                f"with other settings" if last is not None and last.saved_step is not None
                else "no checkpoint was written after it")
        raise NonFiniteError(f"training stopped: the loss or the gradient of optimizer step {step} is not finite "
                             f"(NaN or inf); {kept}. Lower the learning rate (train.lr, train.lr_factor), lengthen "
                             f"train.warmup_steps, set train.clip_grad_norm, or train in 32-true or bf16-mixed "
                             f"(trainer.precision)")

    def _log_step(self, optimizer, sums: Tensor, grad_norm: Tensor) -> None:
        """Log this optimizer step's loss, perplexity, tokens, gradient norm and learning rate, and the
        throughput (tokens per second) over the timed steps since the last logging step."""
        tokens = sums[1].clamp(min=1)
        metrics = {"train/loss": (sums[2] / tokens).float(), "train/ppl": torch.exp(sums[3] / tokens).float(),
                   "train/src_tokens_per_step": sums[0].float(), "train/tgt_tokens_per_step": sums[1].float(),
                   "train/grad_norm": grad_norm, "train/lr": optimizer.param_groups[0]["lr"]}
        if self._interval["seconds"]:
            rate = (self._interval["tokens"] / self._interval["seconds"]).float()
            metrics["train/src_tokens_per_sec"], metrics["train/tgt_tokens_per_sec"] = rate.unbind()
        if self.device.type == "cuda":
            metrics["train/peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
        self.log_dict(metrics)
        self._interval = {"tokens": 0, "seconds": 0.0}

    def train_tokens_per_sec(self) -> float | None:
        """Mean training throughput of this process's fit: target tokens (all ranks) per second over the
        timed optimizer steps (all but the first of the fit and the first after each validation); None
        before two steps."""
        if not self._timed["seconds"]:
            return None
        return float(self._timed["tokens"][1]) / self._timed["seconds"]

    # --- evaluation --------------------------------------------------------------------------
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self._eval_step(batch, self.val_splits[dataloader_idx])

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def on_validation_epoch_start(self):
        self._eval = {split: self._new_eval() for split in self.val_splits}
        self._step_started = None  # do not count validation time against training throughput
        self._swap_in_average()

    def on_test_epoch_start(self):
        self._eval = {"test": self._new_eval()}
        if self.trainer.ckpt_path is None:  # the weights in memory (a checkpoint loaded holds its average already)
            self._swap_in_average()

    def _swap_in_average(self) -> None:
        """train.ema_decay: the average in the model while it is evaluated (``_swap_out_average`` after)."""
        if self.ema is not None:
            self.ema.swap_in()

    def _swap_out_average(self) -> None:
        if self.ema is not None:
            self.ema.swap_out()

    def on_validation_end(self):
        self._swap_out_average()

    def on_test_end(self):
        self._swap_out_average()

    @staticmethod
    def _new_eval() -> dict:
        return {"sums": torch.zeros(3, dtype=torch.float64), "hypotheses": {}}

    def on_validation_epoch_end(self):
        for split in self.val_splits:
            self._log_evaluation(split)
        self.validated_at_step = self.global_step

    def on_test_epoch_end(self):
        self._log_evaluation("test")

    def _eval_step(self, batch, split: str) -> None:
        src, tgt = batch["src"], batch["tgt"]
        pad = self.model.config.pad_id
        logits = self.model(src, tgt[:, :-1])
        loss_sum, nll_sum, n_tokens = label_smoothed_cross_entropy(
            logits, tgt[:, 1:], self.optim["label_smoothing"], pad)
        state = self._eval[split]
        state["sums"] += torch.tensor([float(loss_sum), float(nll_sum), float(n_tokens)], dtype=torch.float64)
        limit = self._bleu_limit(split)  # BLEU over the sentences with index < limit: the split's first ones
        if self.tokenizer is None or limit == 0:
            return
        rows = torch.arange(len(src), device=src.device)
        if limit is not None:
            rows = (self._eval_positions(split, batch["index"]) < limit).nonzero().squeeze(1)  # (b,)
        if len(rows):
            tok = self.tokenizer
            indices = batch["index"][rows].tolist()
            # data.lang_tags=decoder: each target starts with its language's tag, forced, then dropped
            prefix = tgt[rows, 1:2] if self._decoder_tags else None
            search = SearchBatch(src[rows], tok.bos_id, tok.eos_id, indices, prefix)
            for index, hyps in zip(indices, generate(self.model, search, VALIDATION_DECODE)):
                state["hypotheses"][index] = tok.decode(hyps[0].tokens[1:] if self._decoder_tags else hyps[0].tokens)

    def _eval_positions(self, split: str, index: Tensor) -> Tensor:
        """(b,) each pair's position in its split; with data.pairs, in its direction's part (so that a limit on
        BLEU sentences takes each direction's first ones: the datamodule's pair_positions)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        positions = datamodule.pair_positions(split) if hasattr(datamodule, "pair_positions") else None
        if positions is None:
            return index
        return torch.from_numpy(positions).to(index.device)[index]

    def _log_evaluation(self, split: str) -> None:
        sums = self.trainer.strategy.reduce(self._eval[split]["sums"].to(self.device), reduce_op="sum")
        n = sums[2].clamp(min=1)
        metrics = {f"{split}/loss": (sums[0] / n).float(), f"{split}/ppl": torch.exp(sums[1] / n).float()}
        scored = self._corpus_metrics(split)
        if scored is not None:  # NCCL reduces device tensors only
            values, count, per_pair = scored
            for name, value in values.items():
                metrics[f"{split}/{name}"] = torch.tensor(value, device=self.device)
            metrics[f"{split}/bleu_sentences"] = torch.tensor(float(count), device=self.device)  # sentences scored
            for (name, pair), value in per_pair.items():  # data.pairs: each direction's (split/NAME: their mean)
                metrics[f"{split}/{name}/{pair}"] = torch.tensor(value, device=self.device)
        # Every rank holds the same values already; sync_dist only keeps Lightning's bookkeeping uniform.
        self.log_dict(metrics, prog_bar=split in ("val", "test"), sync_dist=True, add_dataloader_idx=False)
        self._eval[split] = {}

    def _corpus_metrics(self, split: str) -> tuple[dict[str, float], int, dict[tuple[str, str], float]] | None:
        """({metric name: value}, number of sentences, {(metric name, pair): value}): each of ``train.val_metrics``
        over the hypotheses of all ranks against the datamodule's raw references (and sources, for a metric that
        needs them); None when they are off (limit 0, or no tokenizer or references to decode against). With
        data.pairs each direction is scored alone and the first values are their means; else {}."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if self._bleu_limit(split) == 0 or self.tokenizer is None or not hasattr(datamodule, "references"):
            return None
        hypotheses = self._eval[split]["hypotheses"]
        if self.trainer.world_size > 1:
            gathered = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, hypotheses)
            hypotheses = {k: v for part in gathered for k, v in part.items()}
        if not hypotheses:  # e.g. limit_val_batches left out every sentence below the limit: the worst value
            return {metric.name: 0.0 if metric.higher_is_better else math.inf for metric in self.metrics}, 0, {}
        references = datamodule.references(split)
        indices = sorted(hypotheses)
        self.hypotheses[split] = {i: hypotheses[i] for i in indices}  # kept for significance tests (train.py)
        sources = datamodule.sources(split) if any(metric.needs_sources for metric in self.metrics) else None
        groups = datamodule.pair_indices(split) if hasattr(datamodule, "pair_indices") else None
        if groups is None:
            return ({metric.name: self._corpus_value(metric, hypotheses, references, sources, indices)
                     for metric in self.metrics}, len(indices), {})
        chosen = {pair: [i for i in group.tolist() if i in hypotheses] for pair, group in groups.items()}
        chosen = {pair: rows for pair, rows in chosen.items() if rows}
        per_pair = {(metric.name, pair): self._corpus_value(metric, hypotheses, references, sources, rows)
                    for metric in self.metrics for pair, rows in chosen.items()}
        values = {metric.name: sum(per_pair[(metric.name, pair)] for pair in chosen) / len(chosen)
                  for metric in self.metrics}
        return values, len(indices), per_pair

    @staticmethod
    def _corpus_value(metric, hypotheses: dict[int, str], references: list[str], sources: list[str] | None,
                      indices: list[int]) -> float:
        """The corpus value of ``metric`` over the hypotheses at ``indices`` against their references (and
        sources, where given)."""
        return float(metric.compute([hypotheses[i] for i in indices], [references[i] for i in indices],
                                    None if sources is None else [sources[i] for i in indices]).value)

    def _bleu_limit(self, split: str) -> int | None:
        """train.val_bleu_max_sentences for every validation set, train.test_bleu_max_sentences for test."""
        return self.bleu_limits["test" if split == "test" else "val"]

    # --- checkpoints -------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Make the checkpoint self-contained: model config, SentencePiece model and data config ride along, with
        the package version that wrote them and the training run's identity (what averaging compares). Weights that
        are not finite (or a fit that met a non-finite step) are never saved: ``NonFiniteError`` instead, so the
        last finite checkpoint stays (one host read per save)."""
        if self.attached_to_trainer():
            self.check_finite()
        bad = first_non_finite(checkpoint.get("state_dict", {}))
        if bad is not None:
            step = checkpoint.get("global_step")
            raise NonFiniteError(f"refusing to save a checkpoint whose weights are not finite ({bad} holds NaN or inf"
                                 + (f", after optimizer step {step}" if step is not None else "")
                                 + "): the checkpoints already written keep the last finite weights")
        if self.ema is not None and "state_dict" in checkpoint:  # decoding weights: the average; trained ones kept
            self.ema.to_checkpoint(checkpoint)
        checkpoint[CKPT_MODEL_CONFIG] = self.model.config.to_dict()
        checkpoint[CKPT_VERSION] = __version__
        checkpoint[CKPT_RUN] = self.training_run
        if self.data_config is not None:
            checkpoint[CKPT_DATA_CONFIG] = self.data_config
        if self.tokenizer is not None:
            checkpoint.update(tokenizer_entries(self.tokenizer))  # the target model and vocabulary where it has them

    def attached_to_trainer(self) -> bool:
        """Whether a Trainer runs this module (``trainer.fit(ckpt_path=...)`` restoring it: resuming), not
        ``load_from_checkpoint`` loading weights. ``LightningModule.trainer`` raises RuntimeError when none is."""
        try:
            self.trainer
        except RuntimeError:
            return False
        return True

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved_tokenizer = checkpoint_tokenizer(checkpoint, "being loaded") if CKPT_TOKENIZER in checkpoint else None
        if self.tokenizer is None and saved_tokenizer is not None:
            self.tokenizer = saved_tokenizer
        elif saved_tokenizer is not None and self.tokenizer != saved_tokenizer:
            raise ValueError("the checkpoint was trained with another SentencePiece vocabulary than the data's "
                             "(the vocabulary cache was rebuilt, or the data options changed): resume with the "
                             "checkpoint's own: data.tokenizer_path=FILE, the SentencePiece model it embeds (key "
                             f"{CKPT_TOKENIZER!r})")
        resuming = self.attached_to_trainer() and "optimizer_states" in checkpoint
        if resuming and self.optim["ema_decay"] is not None and self.trainer.state.fn == "fit":
            self._ema_resumed = take_average(checkpoint, "the checkpoint being resumed")  # trained weights load
        elif resuming and self.trainer.state.fn == "fit" and take_trained(checkpoint):  # an EMA run's, by path
            log.warning("the checkpoint being resumed was written by a run with train.ema_decay and this run has "
                        "none: it continues the trained weights (which its optimizer state belongs to), not the "
                        "moving average, which is dropped")
        if self.data_config is None:
            self.data_config = checkpoint.get(CKPT_DATA_CONFIG)
        if isinstance(checkpoint.get(CKPT_RUN), str):  # the run this one continues (absent in older checkpoints)
            self.training_run = checkpoint[CKPT_RUN]
