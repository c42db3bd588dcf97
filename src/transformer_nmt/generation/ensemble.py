"""An ensemble of Transformers that decodes as one model: at each step the mean of the models' log-probabilities.

``Ensemble`` has the decoding interface of ``Transformer`` that generation/search.py's searches use (``config``,
``encode``, ``new_cache``, ``next_log_probs``), so greedy, beam search, sampling and prefixes work unchanged:

- ``encode`` runs every encoder and concatenates the memories along the feature axis, (B, S, sum of d_model):
  the searches select and repeat memory rows as they do for one model, and each model reads its own slice back;
- ``new_cache`` gives one decoder cache per model (``EnsembleCache``), whose ``layers`` list every model's
  layers, so the beam's reordering moves each model's attention cache;
- ``next_log_probs`` is the mean over models of log_softmax(logits) with pad and bos forbidden, not renormalised
  (fairseq averages probabilities instead; the log-linear mean is what Marian and Sockeye's ``log_linear`` use).

The models must share the tokenizer (inference/translate.py refuses others); their architectures may differ.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from transformer_nmt.generation.search import forbid_special
from transformer_nmt.model.transformer import DecoderCache, Transformer


class EnsembleCache:
    """Each model's DecoderCache; ``layers`` holds all their layers, so ``search.reorder_beams`` moves them all."""

    def __init__(self, caches: list[DecoderCache]):
        self.caches = caches
        self.layers = [layer for cache in caches for layer in cache.layers]

    def __len__(self) -> int:
        return len(self.caches[0])

    def reorder(self, index: Tensor) -> None:
        for cache in self.caches:
            cache.reorder(index)


class Ensemble(nn.Module):
    """Models decoded together; ``config`` is the first model's, with the smallest ``max_positions`` of all."""

    def __init__(self, models: list[Transformer]):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = nn.ModuleList(models)
        self.config = replace(models[0].config, max_positions=min(m.config.max_positions for m in models))
        self.widths = [m.config.d_model for m in models]

    @property
    def device(self) -> torch.device:
        """Where the first model's weights are (``load_ensemble`` puts all on one device)."""
        return self.models[0].device

    def encode(self, src: Tensor) -> Tensor:
        """src (B, S) -> every model's memory side by side, (B, S, sum of d_model)."""
        return torch.cat([model.encode(src) for model in self.models], dim=-1)

    def new_cache(self) -> EnsembleCache:
        return EnsembleCache([model.new_cache() for model in self.models])

    def next_log_probs(self, last: Tensor, memory: Tensor, src: Tensor, cache: EnsembleCache, bos_id: int) -> Tensor:
        """(b, V) mean over models of each one's log-probabilities of the next token after ``last`` (b, 1)."""
        total = None
        for model, part, own in zip(self.models, memory.split(self.widths, dim=-1), cache.caches):
            logits = forbid_special(model.decode(last, part, src, cache=own)[:, -1], bos_id, model)  # (b, V)
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            total = log_probs if total is None else total + log_probs
        return total / len(self.models)

    def log_probs(self, src: Tensor, tgt_in: Tensor, bos_id: int) -> Tensor:
        """Teacher-forced: src (B, S), tgt_in (B, T) -> (B, T, V) mean log-probabilities, pad and bos forbidden."""
        return torch.stack([teacher_forced_log_probs(model, src, tgt_in, bos_id) for model in self.models]).mean(0)


def teacher_forced_log_probs(model: Transformer | Ensemble, src: Tensor, tgt_in: Tensor, bos_id: int) -> Tensor:
    """src (B, S), tgt_in (B, T) -> (B, T, V) float32 log-probabilities of each next token, pad and bos forbidden
    (as the searches score them); an ensemble's: the mean of its models'."""
    if isinstance(model, Ensemble):
        return model.log_probs(src, tgt_in, bos_id)
    logits = model(src, tgt_in).float()  # (B, T, V)
    logits[..., [model.config.pad_id, bos_id]] = float("-inf")
    return torch.log_softmax(logits, dim=-1)
