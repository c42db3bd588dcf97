"""Loading an ensemble: ``ckpt=[A,B,C]`` (translate, evaluate) reads each checkpoint into one
``generation.ensemble.Ensemble``.

The models must share the tokenizer (the same SentencePiece model, byte for byte): their token ids must mean
the same pieces, or the mean of their log-probabilities means nothing. Another tokenizer is refused, naming
both files. So is another translation direction (``data.src_lang``, ``data.tgt_lang`` and any language set a data
config records: checkpoint.LANGUAGE_FIELDS), or a model that records none beside one that does: an en->de and a
de->en model share one vocabulary in the reverse fine-tuning study, and their mean translates in neither direction.
"""

from __future__ import annotations

from typing import Any

import torch

from transformer_nmt.checkpoint import describe_languages, load_checkpoint, translation_languages
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.ensemble import Ensemble
from transformer_nmt.model.transformer import Transformer


def checkpoint_paths(ckpt: Any) -> list[str]:
    """``ckpt=PATH`` or ``ckpt=[A,B,...]`` as a list of paths; anything else is an error saying what to give."""
    paths = list(ckpt) if isinstance(ckpt, (list, tuple)) else [ckpt]
    if not paths or not all(isinstance(p, str) and p for p in paths):
        raise SystemExit(f"ckpt={ckpt!r}: give ckpt=PATH, or ckpt=[A,B,...] for an ensemble")
    return paths


def load_ensemble(paths: list[str], map_location: str | torch.device = "cpu"
                  ) -> tuple[Transformer | Ensemble, Tokenizer, dict]:
    """(model, tokenizer, meta): one checkpoint's Transformer, or for several their Ensemble; ``meta`` is the
    first checkpoint's (``load_checkpoint``), its ``path`` the list of paths when there are several."""
    models = []
    first_tokenizer, first_meta = None, None
    for path in paths:
        model, tokenizer, meta = load_checkpoint(path, map_location=map_location)
        if first_tokenizer is None:
            first_tokenizer, first_meta = tokenizer, meta
        elif tokenizer.identity != first_tokenizer.identity:
            parts = ("source SentencePiece models", "target SentencePiece models", "joint vocabularies (pieces)")
            differ = ", ".join(part for part, a, b in zip(parts, tokenizer.identity, first_tokenizer.identity,
                                                          strict=True) if a != b)
            raise SystemExit(f"ensemble: checkpoint {path} has another tokenizer than {paths[0]} (their {differ} "
                             f"differ): an ensemble's models must share one")
        languages = translation_languages(meta.get("data_config"))
        if languages != translation_languages(first_meta.get("data_config")):
            raise SystemExit(f"ensemble: checkpoint {path} translates {describe_languages(languages)}, {paths[0]} "
                             f"{describe_languages(translation_languages(first_meta.get('data_config')))}: an "
                             f"ensemble's models must translate in one direction")
        models.append(model)
    if len(models) == 1:
        return models[0], first_tokenizer, first_meta
    return Ensemble(models).eval(), first_tokenizer, {**first_meta, "path": list(paths)}
