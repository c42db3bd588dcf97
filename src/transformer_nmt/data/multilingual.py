"""The splits of a run over several directions (``data.pairs``): each pair's corpora read as one pair's are, tagged
by the one rule of data/language_tags.py, and put in one table per split so that batches mix pairs.

Per split and pair (src, tgt): the raw sentences (``PREFIX.{src}``, ``PREFIX.{tgt}``, cached as one pair's), their
token ids, the pairs kept by the usual filter (each pair's own lengths), then the columns renamed to ``src_*`` and
``tgt_*`` and the tags put in (the source's tag before each source, style decoder also the target's tag before each
target; cached, memory-mapped). A tagged pair that no longer fits ``data.max_positions`` is dropped and counted.
The training split keeps each kept pair once (the pool), and each epoch takes its members from it as temperature
sampling says, drawn anew per epoch (data/pair_sampling.py's ``EpochDraw``, ``Split.draw``; T=1: the pool, each
pair once); val and test keep every pair, in data.pairs order. ``Split.pair_of`` says which direction each kept
pair belongs to, so validation scores each (``pair_indices``).

``TranslationDataModule`` takes this class as a mixin: it is the datamodule's set-up where data.pairs is given.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, fields

import datasets
import numpy as np

from transformer_nmt.data.batching import pair_widths
from transformer_nmt.data.corpus import FilterReport
from transformer_nmt.data.language_tags import Direction, LanguageTags, tag_in_text
from transformer_nmt.data.pair_sampling import epoch_counts, epoch_draw
from transformer_nmt.data.split import Split

log = logging.getLogger(__name__)

COLUMNS = ("src_ids", "src_len", "tgt_ids", "tgt_len")


class MultilingualSplits:
    """The multilingual set-up of ``TranslationDataModule`` (see the module docstring)."""

    def language_tags(self) -> LanguageTags | None:
        return LanguageTags.of(self.config)

    def _setup_pairs(self, configured: list[str]) -> None:
        tags = self.language_tags()
        if self.config.spm_alpha and tags.style == "decoder":
            raise ValueError("data.spm_alpha > 0 with data.lang_tags=decoder: sampled segmentations put no tag on the "
                             "target side; use data.lang_tags=target, or data.spm_alpha=0")
        names = list(self.pair_specs)
        raws = {split: {name: self._raw_split(split, spec=spec) for name, spec in self.pair_specs.items()}
                for split in configured}
        if "train" in raws:
            self._check_language_tags_absent(tags, raws["train"])
            train, sides, seen = [], [], set()
            for name in names:  # each language's text once: en of en-de, de, then fr of en-fr, ...
                raw, key, cleaned = raws["train"][name]
                train.append((raw, key, cleaned))
                sides += [(raw, lang) for lang in self.pair_specs[name].langs if lang not in seen]
                seen |= set(self.pair_specs[name].langs)
            self.tokenizer = self._tokenizer(train, tags.pieces(), sides)
        else:
            self.tokenizer = self._tokenizer([], tags.pieces())
        tags.piece_ids(self.tokenizer, tags.pieces())  # each tag one piece of the vocabulary, or an error
        for split in configured:
            self.splits[split] = self._pairs_split(split, tags, raws[split])
            report = self.splits[split].report
            (log.warning if report.utf8_replaced_lines or report.control_replaced_sentences else log.info)(str(report))

    def _check_language_tags_absent(self, tags: LanguageTags, train: dict) -> None:
        """A tag is a token no training sentence holds (as for data.train_tags: the text compared after NFKC
        normalization, as SentencePiece matches pieces)."""
        for name, (raw, _, _) in train.items():
            for lang in self.pair_specs[name].langs:
                piece = tag_in_text(raw.data.column(lang), tags.pieces())
                if piece is not None:
                    raise ValueError(f"data.pairs: the language tag {piece!r} occurs in the {lang} text of "
                                         f"data.train ({name}): a tag must be a token no sentence holds (compared "
                                         f"after NFKC normalization, as SentencePiece reads it)")

    def _pairs_split(self, split: str, tags: LanguageTags, raws: dict):
        tokens_parts, raw_parts, rows, reports, tokenized_now, offset = [], [], [], [], False, 0
        for index, (name, spec) in enumerate(self.pair_specs.items()):
            src, tgt = spec.langs
            raw, raw_key, cleaned = raws[name]
            tokens, tok_key, now = self._tokens(split, raw, raw_key, langs=(src, tgt))
            tokenized_now |= now
            keep, _, report = self._filtered(split, tokens, tok_key, langs=(src, tgt))
            generic = tokens.rename_columns({f"{src}_ids": "src_ids", f"{src}_len": "src_len",
                                             f"{tgt}_ids": "tgt_ids", f"{tgt}_len": "tgt_len"}).select_columns(COLUMNS)
            direction = Direction(tags, src, tgt)
            generic, key = self._tagged(generic, tok_key, direction.source_tag(self.tokenizer), "src", split)
            for tag_id in direction.decoder_prefix(self.tokenizer):
                generic, key = self._tagged(generic, key, tag_id, "tgt", split)
            src_lens = generic.data.column("src_len").to_numpy()
            tgt_lens = generic.data.column("tgt_len").to_numpy()
            keep = np.asarray(keep, dtype=np.int64)
            fits = (src_lens[keep] + 1 <= self.max_positions) & (tgt_lens[keep] + 1 <= self.max_positions)
            if not fits.all():
                log.info("%s %s: %d tagged pair(s) dropped: longer than data.max_positions with the tag", split, name,
                         int((~fits).sum()))
                keep, report = keep[fits], FilterReport(**{**asdict(report), "too_long": report.too_long +
                                                           int((~fits).sum())})
            self._check_kept(f"{split} ({name})", keep, report)
            tokens_parts.append(generic)
            raw_parts.append(raw.rename_columns({src: "src", tgt: "tgt"}).select_columns(["src", "tgt"]))
            rows.append(keep + offset)
            offset += len(generic)
            reports.append(FilterReport(**{**asdict(report), **cleaned}))
        draw = None
        if split == "train":  # the pool: each kept pair once; an epoch's members drawn from it (pair_sampling.py)
            kept = [len(part) for part in rows]
            counts = epoch_counts(kept, self.config.pair_temperature)
            draw = epoch_draw(kept, self.config.pair_temperature, self.seed)
            log.info("train: %s pairs per epoch (data.pair_temperature=%s): %s", f"{sum(counts):,}",
                     self.config.pair_temperature, ", ".join(f"{name} {count:,} of {n:,}" for name, count, n in
                                                             zip(self.pair_specs, counts, kept)))
        tokens = tokens_parts[0] if len(tokens_parts) == 1 else datasets.concatenate_datasets(tokens_parts)
        raw = raw_parts[0] if len(raw_parts) == 1 else datasets.concatenate_datasets(raw_parts)
        keep = np.concatenate(rows)
        pair_of = np.concatenate([np.full(len(part), i, dtype=np.int64) for i, part in enumerate(rows)])
        widths = pair_widths(*(tokens.data.column(f"{side}_len").to_numpy()[keep] for side in ("src", "tgt")))
        numbers = [f.name for f in fields(FilterReport) if f.name != "split"]
        report = FilterReport(split, **{k: sum(getattr(r, k) for r in reports) for k in numbers})
        source_tags = None
        if split == "train" and self.config.spm_alpha:  # sampled segmentations put each source's tag back
            ids = [Direction(tags, *spec.langs).source_tag(self.tokenizer) for spec in self.pair_specs.values()]
            source_tags = np.asarray(ids, dtype=np.int64)[pair_of]
        return Split(split, raw, tokens, keep, widths, report, tokenized_now, source_tags=source_tags,
                     pair_of=pair_of, draw=draw)

    def pair_indices(self, split: str) -> dict[str, np.ndarray] | None:
        """{pair name: the indices (``batch["index"]``) of its kept pairs} of a split of data.pairs; None for one
        pair."""
        s = self._split(split)
        if s.pair_of is None:
            return None
        return {name: np.flatnonzero(s.pair_of == i) for i, name in enumerate(self.pair_specs)}

    def pair_positions(self, split: str) -> np.ndarray | None:
        """(n_kept,) each index's position within its direction's part of a split of data.pairs (so that a limit on
        scored sentences takes each direction's first ones); None for one pair. Computed once per prepared split."""
        s = self._split(split)
        if s.pair_of is None:
            return None
        cached = getattr(self, "_pair_positions", {}).get(split)
        if cached is not None and cached[0] is s:
            return cached[1]
        positions = np.zeros(len(s.pair_of), dtype=np.int64)
        for group in self.pair_indices(split).values():
            positions[group] = np.arange(len(group))
        self._pair_positions = {**getattr(self, "_pair_positions", {}), split: (s, positions)}
        return positions
