"""Which direction a command translates a model in: ``src_lang=`` / ``tgt_lang=`` against the languages its
checkpoint (or export) records (data/language_tags.py holds the rule that tags the ids).

A model trained on several pairs (data.pairs) translates any of them (``tgt_lang=fr``; ``src_lang`` too where
several sources lead to that target), an untrained one only with ``zero_shot=true`` (and so labelled); a model of
one pair is untagged and translates as ever, and a direction other than its own is refused, naming it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.language_tags import Direction, LanguageTags


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
