"""Which direction a command translates a model in: ``src_lang=`` / ``tgt_lang=`` against the languages its
checkpoint (or export) records (data/language_tags.py holds the rule that tags the ids).

A model trained on several pairs (data.pairs) translates any of them (``tgt_lang=fr``; ``src_lang`` too where
several sources lead to that target), an untrained one only with ``zero_shot=true`` (and so labelled); a model of
one pair is untagged and translates as ever, and a direction other than its own is refused, naming it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.language_tags import Direction, LanguageTags
from transformer_nmt.options import option


@dataclass
class DirectionOptions:
    """The options that pick a direction, one home for every command that reads a model (translate, evaluate,
    synthesize, explore, analyze_heads: each takes them with ``options.option_of``)."""

    src_lang: Optional[str] = option(None, "a model of several pairs (data.pairs): the input's language; null: the "
                                           "one its pairs allow for tgt_lang")
    tgt_lang: Optional[str] = option(None, "a model of several pairs: the language to translate into (e.g. fr); "
                                           "null: the one its pairs allow. A model of one pair: its own, or refused")
    zero_shot: bool = option(False, "translate a direction the model was not trained on (its tags must exist); "
                                    "false: such a direction is refused, naming those it knows")


def direction_of(options: Any, meta: Mapping[str, Any], source: str | None = None) -> Direction | None:
    """``model_direction`` for a command's ``options`` (its src_lang, tgt_lang, zero_shot) and a loaded model's
    ``meta`` (its data config; ``source``: how messages name the model, by default its checkpoint)."""
    return model_direction(meta.get("data_config"), options.src_lang, options.tgt_lang, options.zero_shot,
                           source or meta.get("source") or f"checkpoint {meta.get('path')}")


def model_direction(data_config: Mapping[str, Any] | None, src_lang: str | None, tgt_lang: str | None,
                    zero_shot: bool, source: str) -> Direction | None:
    """The tagged direction to translate in, None for a one-pair model; a SystemExit naming the directions the
    model knows for one it does not (``source``: the checkpoint or export, for messages)."""
    try:
        tags = LanguageTags.of(data_config)
        if tags is not None:
            direction = tags.direction(src_lang, tgt_lang, zero_shot)
            if direction.zero_shot:
                print(f"warning: {direction.name} is a zero-shot direction: {source} was not trained on it",
                      file=sys.stderr)
            return direction
    except ValueError as error:
        raise SystemExit(f"{source}: {error}") from None
    if data_config is None:  # an old checkpoint without a data config: its languages are not known
        return None
    own = (data_config.get("src_lang", DataConfig.src_lang), data_config.get("tgt_lang", DataConfig.tgt_lang))
    asked = (src_lang or own[0], tgt_lang or own[1])
    if asked != own:
        raise SystemExit(f"{source}: the model was trained on one pair, {'-'.join(own)} (untagged); it cannot "
                         f"translate {'-'.join(asked)}")
    if zero_shot:
        raise SystemExit(f"zero_shot=true: {source} was trained on one pair, {'-'.join(own)}, without tags")
    return None
