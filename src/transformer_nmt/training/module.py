"""The LightningModule that trains a ``Transformer`` with the paper's recipe: the training step (teacher-forced
label-smoothed cross-entropy, loss.py, over the non-padding target tokens; gradients turned into the per-token
mean of the optimizer step), Adam and the lr schedule (5.3, schedules.py), and evaluation.

The ``Transformer`` it wraps is a plain ``nn.Module``; everything Lightning-specific lives here. Validation adds
greedy-decoded corpus metrics (``train.val_metrics``, registered in metrics/: BLEU by default, COMET and others on
request) over the first ``val_bleu_max_sentences`` sentences of the split, gathered from every DDP rank. With
several validation sets (``data.val=[A,B]``) each is scored and logged under its own name (``val/``, ``val_NAME/``:
DataConfig.val_splits). A loss or gradient that is not finite stops the run (non_finite.py); each micro-batch's
dropout masks are seeded by where training is (dropout_seeds.py).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import asdict

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
from transformer_nmt.training.dropout_seeds import seed_dropout_masks
from transformer_nmt.training.ema import WeightEMA, check_decay, take_average, take_trained
from transformer_nmt.training.freezing import freeze
from transformer_nmt.training.lightning_adapter import is_logging_step
from transformer_nmt.training.loss import label_smoothed_cross_entropy
from transformer_nmt.training.non_finite import FirstNonFiniteStep, NonFiniteError, first_non_finite
from transformer_nmt.training.rdrop import check_alpha, symmetric_kl, two_passes
from transformer_nmt.training.schedules import check_schedule, lr_lambda

VALIDATION_DECODE = DecodeConfig(strategy="greedy", beam=1)  # validation BLEU: greedy, through generation/
LOSS_SCALE_TOKENS = 1000.0  # backward runs on (summed token loss) / this; see training_step

log = logging.getLogger(__name__)


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
        check_schedule(self.optim["lr_schedule"], self.optim["warmup_steps"])
        if self.optim["ema_decay"] is not None:
            check_decay(self.optim["ema_decay"])  # refused here, before the fit, not at its start
        self.rdrop_alpha = check_alpha(self.optim["rdrop_alpha"])  # train.rdrop_alpha: 0 is one pass
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
        # (5,) float64 on the device: source tokens, target tokens, loss sum, nll sum, R-Drop's symmetric term's sum
        self._step_sums = None
        self._non_finite = FirstNonFiniteStep()  # the first optimizer step whose loss or gradient is not finite
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
        """Section 5.3: Adam(beta1 0.9, beta2 0.98, eps 1e-9), lr from ``train.lr_schedule`` per optimizer step
        (schedules.py)."""
        o = self.optim
        fused = True if o["fused_adam"] and self.device.type == "cuda" else None  # None: torch's default
        trainable = [p for p in self.parameters() if p.requires_grad]  # frozen ones (train.freeze): no Adam state
        optimizer = torch.optim.Adam(trainable, lr=1.0, betas=tuple(o["betas"]), eps=o["eps"], fused=fused)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, self.model.config.d_model))
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
        seed_dropout_masks(self.seed, self.global_rank, self.global_step, batch_idx)

    def training_step(self, batch, batch_idx):
        src, tgt = batch["src"], batch["tgt"]  # (B, S), (B, T)
        tgt_in, labels = tgt[:, :-1], tgt[:, 1:]  # teacher forcing: predict token t+1 from tokens <= t
        pad = self.model.config.pad_id
        if self.rdrop_alpha:
            loss_sum, nll_sum, n_tokens, kl_sum = self._rdrop_losses(src, tgt_in, labels, pad)
        else:
            logits = self.model(src, tgt_in)  # (B, T-1, V)
            # The logits feed nothing but the loss: their memory can take their gradient (see the loss).
            loss_sum, nll_sum, n_tokens = label_smoothed_cross_entropy(logits, labels, self.optim["label_smoothing"],
                                                                       pad, overwrite_logits=True)
            kl_sum = torch.zeros((), device=loss_sum.device)
        # (source tokens, target tokens, loss sum, nll sum, symmetric KL sum): summed on the device, read when logged.
        sums = torch.stack([(src != pad).sum(), n_tokens, loss_sum.detach(), nll_sum.detach(), kl_sum.detach()])
        sums = sums.double()
        self._step_sums = sums if self._step_sums is None else self._step_sums + sums
        # Every token of an optimizer step weighs the same, whatever the micro-batch it came in: backward
        # runs on the loss summed over tokens (over a fixed LOSS_SCALE_TOKENS, to keep fp16 magnitudes
        # ordinary), and on_before_optimizer_step turns the summed gradients into the per-token mean.
        return (loss_sum + self.rdrop_alpha / 2 * kl_sum) / LOSS_SCALE_TOKENS

    def _rdrop_losses(self, src: Tensor, tgt_in: Tensor, labels: Tensor, pad: int):
        """R-Drop's two passes (training/rdrop.py) as one forward of the batch stacked on itself: (the mean of the two
        passes' smoothed loss sums, of their nll sums, the batch's target tokens, the sum over them of
        1/2 (KL(P1 || P2) + KL(P2 || P1)))."""
        batch = src.shape[0]
        logits = self.model(*two_passes(src, tgt_in))  # (2B, T-1, V): the first B rows one mask, the rest another
        # Not overwrite_logits: the divergence reads the logits again in its backward pass.
        loss_sum, nll_sum, n_tokens = label_smoothed_cross_entropy(logits, torch.cat([labels, labels]),
                                                                   self.optim["label_smoothing"], pad)
        kl_sum = symmetric_kl(logits[:batch], logits[batch:], labels, pad) / 2
        return loss_sum / 2, nll_sum / 2, n_tokens // 2, kl_sum

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
        """Remember, on the device (no host sync), whether this optimizer step's loss or gradient norm is not finite
        (non_finite.FirstNonFiniteStep.note; under 16-mixed's gradient scaler, the loss only)."""
        # global_step: the optimizer steps taken; this one is global_step + 1
        self._non_finite.note(sums, grad_norm, self.global_step + 1,
                              scaled=getattr(self.trainer.precision_plugin, "scaler", None) is not None)

    def check_finite(self) -> None:
        """``NonFiniteError`` if an optimizer step of this fit had a loss or gradient that is not finite (one host
        read of a device scalar: where values are read anyway, a logging step or a checkpoint's save). It names
        the step, and the last checkpoint written, which holds finite weights (every save checks them)."""
        self._non_finite.check(self.trainer)

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
        if self.rdrop_alpha:
            metrics["train/rdrop_kl"] = (sums[4] / tokens).float()  # 1/2 (KL(P1 || P2) + KL(P2 || P1)) per token
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
