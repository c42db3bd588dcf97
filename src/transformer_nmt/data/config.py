"""``DataConfig``: every option of the data path with its default and help, the one home of both.

Plain dataclasses, no Lightning: Hydra's ``data`` node is this schema (training/config.py registers it) with
conf/data/*.yaml as diffs over it; ``TranslationDataModule`` takes one; ``inference/evaluate.py`` reads a
split of a checkpoint's data through ``DataConfig.from_record(...).corpus_spec()`` without Lightning.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any

from omegaconf import MISSING

from transformer_nmt.data.corpus import CorpusSpec
from transformer_nmt.options import Role, declares_roles, option
from transformer_nmt.records import RecordError, from_record

# What ``_target_`` a checkpoint's data config may name: the datamodule, before and after the layout of
# 2026-12 (old checkpoints were written when the config was instantiated by Hydra).
DATAMODULE_TARGETS = ("transformer_nmt.datamodule.TranslationDataModule",
                      "transformer_nmt.data.datamodule.TranslationDataModule")


# A source tag (data.train_tags): one token, no blank or control character, so that it stays one piece
TAG = re.compile(r"[^\s\x00-\x1f\x7f]{1,32}")
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")  # SentencePiece's names of ids 0-3: never a tag
TRAINING, EVALUATION, MAY_CHANGE = Role.TRAINING, Role.EVALUATION, Role.MAY_CHANGE  # the options' roles


@dataclass(frozen=True)
class TrainCorpus:
    """One corpus of the training set (``DataConfig.train_corpora``)."""

    location: str  # prefix, file or hub split name, as data.train gives it
    upsample: int = 1  # its pairs enter an epoch this many times
    tag: str | None = None  # put before each of its source sentences


@declares_roles
@dataclass
class DataConfig:
    """The corpus, the shared vocabulary, filtering and batching (``data.*``). Each option's role (options.Role):
    the evaluation sets and their batches are evaluation-only; processes and caches may change on resume."""

    format: str = option("text", "text (PREFIX.{src_lang}, PREFIX.{tgt_lang}) | tsv | jsonl | hub", role=TRAINING)
    src_lang: str = option("en", "source language: the column or file suffix", role=TRAINING)
    tgt_lang: str = option("de", "target language", role=TRAINING)
    train: Any = option(MISSING, "required: prefix (text: PREFIX.{src_lang}[.gz], PREFIX.{tgt_lang}[.gz]), file "
                                 "(tsv, jsonl) or hub split name; [A,B,...]: several corpora read as one training "
                                 "set, in this order (a shared vocabulary over all), each upsampled and tagged as "
                                 "train_upsample and train_tags say", role=TRAINING)
    train_upsample: list[int] | None = option(None, "one per data.train corpus: how many times each of its pairs "
                                                    "enters an epoch (e.g. [2,1]: every real pair twice per "
                                                    "back-translated one); null: once each", role=TRAINING)
    train_tags: list[str | None] | None = option(None, "one per data.train corpus: a token put before each of its "
                                                       "source sentences, made one piece of the vocabulary (e.g. "
                                                       "[null,'<BT>']: tagged back-translation, Caswell et al. 2019); "
                                                       "null: none. Sentences given to translate are untagged",
                                                 role=TRAINING)
    pairs: list[str] | None = option(None, "several directions in one model (data/language_tags.py), e.g. "
                                           "[en-de,en-fr,en-cs] (add de-en,... for many-to-many): each pair's "
                                           "corpora found as data.train/val/test say with its languages in place of "
                                           "src_lang/tgt_lang ({pair} in a location: the pair's name, for corpora of "
                                           "their own, data/{pair}/train), tagged as data.lang_tags says, batches "
                                           "mixing pairs; "
                                           "val BLEU logged per pair (val/bleu/en-de) and their mean (val/bleu); "
                                           "null: the one pair src_lang-tgt_lang, untagged", role=TRAINING)
    lang_tags: str = option("target", "with data.pairs: target (<2de> before the source, Johnson et al. 2017) | "
                                      "source (<en> before the source; one target language only) | decoder (<en> "
                                      "before the source, <de> forced as the first target token, as mBART/NLLB)",
                            role=TRAINING)
    pair_temperature: float = option(1.0, "with data.pairs: each pair enters an epoch in proportion to its size "
                                          "to the power 1/T (Arivazhagan et al. 2019): 1: as many pairs as it has; "
                                          "5: flatter, small pairs repeated, large ones subsampled; the epoch's size "
                                          "is the sum of the pairs'", role=TRAINING)
    val: Any = option(MISSING, "required: the validation split, as train; [A,B,...]: several, each validated and "
                               "logged under its own name (val/ the first, which checkpoints and early stopping "
                               "monitor; val_NAME/ the others, NAME from the file name)", role=EVALUATION)
    test: str | None = option(MISSING, "required: the test split, as train; null: no test split", role=EVALUATION)
    columns: list[str] | None = option(None, "tsv only: language of each column; null: [src_lang, tgt_lang]",
                                       role=TRAINING)
    hub_name: str | None = option(None, "format=hub: a Hub dataset name or a save_to_disk directory", role=TRAINING)
    hub_config: str | None = option(None, "format=hub: the dataset's config name (de-en)", role=TRAINING)
    utf8_errors: str = option("strict", "strict: error naming file and line | replace: U+FFFD, lines counted",
                              role=TRAINING)
    control_chars: str = option("strict", "C0 controls but tab (NUL, ESC, CR, ...): strict: error naming file and "
                                           "line | replace: a space, counted", role=TRAINING)
    cache_dir: str = option("data/cache", "vocabulary and Arrow caches, keyed by inputs and options", role=MAY_CHANGE)
    tokenizer_path: str | None = option(None, "an existing SentencePiece model (ids pad 0, unk 1, bos 2, eos 3) "
                                               "instead of training one", role=TRAINING)
    vocab_size: int = option(8000, "shared source+target vocabulary (paper: 37000 BPE on WMT14 en-de)", role=TRAINING)
    spm_model_type: str = option("bpe", "bpe | unigram", role=TRAINING)
    input_sentence_size: int = option(2000000, "sentences sampled to train the vocabulary on large corpora",
                                      role=TRAINING)
    character_coverage: float = option(1.0, "SentencePiece's character coverage", role=TRAINING)
    spm_alpha: float = option(0.0, "subword regularization of the training pairs (data/subword_sampling.py): each "
                                    "epoch a segmentation sampled anew by BPE-dropout (data/bpe_dropout.py) with this "
                                    "merge-drop probability (0.1 in Provilkov et al. 2020; a bpe vocabulary only); "
                                    "the same for the same (seed, epoch) in any process; val and test never "
                                    "sampled. 0: off", role=TRAINING)
    max_tokens: int = option(4096, "per batch: padded source tokens <= this and padded target tokens <= this",
                             role=TRAINING)
    eval_max_tokens: int | None = option(None, "val/test batches; null: max_tokens", role=EVALUATION)
    max_positions: int = option(256, "drop pairs whose source + eos or bos + target is longer", role=TRAINING)
    max_length_ratio: float | None = option(3.0, "drop training pairs whose longer side has > this x the tokens "
                                                  "of the shorter; null: keep all", role=TRAINING)
    seed: int | None = option(None, "batch order: shuffled per epoch from seed + epoch; null: the run's seed",
                              role=TRAINING)
    vocab_seed: int = option(1234, "SentencePiece's sampling seed: one vocabulary for every run seed", role=TRAINING)
    num_proc: int = option(2, "processes for tokenization (datasets.map)", role=MAY_CHANGE)
    num_workers: int = option(0, "DataLoader workers", role=MAY_CHANGE)
    pad_to_multiple: int = option(1, "batch widths rounded up to a multiple of this (train.compile=true makes it 8)",
                                  role=TRAINING)

    def corpus_spec(self) -> CorpusSpec:
        """Where each split's pairs live and how to read them (``corpus.read_pairs`` takes it)."""
        return CorpusSpec(format=self.format, langs=(self.src_lang, self.tgt_lang),
                          locations={"train": self.train, **dict(zip(self.val_splits(), self.val_locations())),
                                     "test": self.test},
                          columns=tuple(self.columns) if self.columns else None, hub_name=self.hub_name,
                          hub_config=self.hub_config, utf8_errors=self.utf8_errors, control_chars=self.control_chars)

    def pair_specs(self) -> dict[str, CorpusSpec]:
        """With data.pairs: each pair's corpus spec (its languages in place of src_lang, tgt_lang), by name (en-de);
        without: {} (``corpus_spec`` is the one pair's)."""
        from transformer_nmt.data.language_tags import LanguageTags, pair_name  # the pairs' rule lives there

        tags = LanguageTags.of(self)
        if tags is None:
            return {}
        if not self.pair_temperature > 0:
            raise ValueError(f"data.pair_temperature={self.pair_temperature}: give a temperature > 0 (1: "
                             f"proportional, 5: flatter)")
        if isinstance(self.train, (list, tuple)) or isinstance(self.val, (list, tuple)) or self.train_tags \
                or self.train_upsample:
            raise ValueError("data.pairs reads one data.train and one data.val location per pair (PREFIX.{lang}): "
                             "drop the lists of data.train / data.val and data.train_tags / data.train_upsample")
        if self.format != "text":
            raise ValueError(f"data.pairs reads PREFIX.{{lang}} files: data.format={self.format} is not supported "
                             f"with it; use data.format=text")
        spec = self.corpus_spec()
        specs = {}
        for s, t in tags.pairs:  # a location holding {pair} is each pair's own: data/{pair}/train -> data/en-de/train
            locations = {split: location.replace("{pair}", pair_name(s, t)) if isinstance(location, str) else location
                         for split, location in spec.locations.items()}
            specs[pair_name(s, t)] = replace(spec, langs=(s, t), locations=locations)
        return specs

    def train_corpora(self) -> list[TrainCorpus]:
        """The training corpora (``data.train`` as one location or a list), each with its upsampling factor and
        source tag; a ``ValueError`` naming the option when the lists do not fit together."""
        if self.train is None or self.train is MISSING:
            return []
        locations = list(self.train) if isinstance(self.train, (list, tuple)) else [self.train]
        if not locations or not all(isinstance(t, str) and t for t in locations):
            raise ValueError(f"data.train={self.train!r}: give a location, or a list [A,B,...] of them")
        if len(set(locations)) != len(locations):
            raise ValueError(f"data.train={locations}: a corpus is listed twice; upsample it with "
                             f"data.train_upsample instead")
        upsample = list(self.train_upsample) if self.train_upsample is not None else [1] * len(locations)
        tags = list(self.train_tags) if self.train_tags is not None else [None] * len(locations)
        for name, values in (("train_upsample", upsample), ("train_tags", tags)):
            if len(values) != len(locations):
                raise ValueError(f"data.{name}={values}: give one value per data.train corpus ({len(locations)}: "
                                 f"{locations})")
        for factor in upsample:
            if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
                raise ValueError(f"data.train_upsample={upsample}: each factor is a whole number >= 1")
        for tag in tags:
            if tag in SPECIAL_PIECES:
                raise ValueError(f"data.train_tags={tags}: {tag!r} is a special piece of the vocabulary "
                                 f"({', '.join(SPECIAL_PIECES)}): choose another tag (e.g. <BT>)")
            if tag is not None and (not isinstance(tag, str) or not TAG.fullmatch(tag)):
                raise ValueError(f"data.train_tags={tags}: a tag is null or a token of 1 to 32 characters without "
                                 f"spaces or control characters (e.g. <BT>), not {tag!r:.40}")
            if tag is not None and unicodedata.normalize("NFKC", tag) != tag:  # as SentencePiece reads text
                raise ValueError(f"data.train_tags={tags}: {tag!r} changes under NFKC normalization (to "
                                 f"{unicodedata.normalize('NFKC', tag)!r}), which SentencePiece applies to the text "
                                 f"before it matches a piece: give the tag in its normalized form")
        return [TrainCorpus(location, factor, tag) for location, factor, tag in zip(locations, upsample, tags)]

    def val_locations(self) -> list[str]:
        """The validation sets' locations, first the monitored one (``val`` as one location or a list)."""
        if self.val is None or self.val is MISSING:
            return []
        locations = list(self.val) if isinstance(self.val, (list, tuple)) else [self.val]
        if not locations or not all(isinstance(v, str) and v for v in locations):
            raise ValueError(f"data.val={self.val!r}: give a location, or a list [A,B,...] of them")
        return locations

    def val_splits(self) -> list[str]:
        """The split names of the validation sets, as logged: ``val`` for the first, ``val_NAME`` for each other
        (NAME: its file or prefix name, letters, digits and _; a number added where two would clash)."""
        names = ["val"]
        for location in self.val_locations()[1:]:
            stem = re.sub(r"\W+", "_", PurePath(location).name.removesuffix(".gz")).strip("_") or "set"
            name, n = f"val_{stem}", 2
            while name in names:
                name, n = f"val_{stem}_{n}", n + 1
            names.append(name)
        return names[: len(self.val_locations())]

    @classmethod
    def from_record(cls, record: Mapping[str, Any], source: str, version: str | None = None) -> DataConfig:
        """The data config a checkpoint recorded (``source``: its file, named in errors; ``version``: the
        transformer_nmt version that wrote it), never instantiated: a ``_target_`` naming the datamodule (what
        configs held until 2026-12) is dropped, any other ``_target_``, any key that is not a data option and any
        value that is not of its option's type (records.from_record) is refused with a ``RecordError``."""
        if not isinstance(record, Mapping):
            raise RecordError(f"{source}: data_config is a {type(record).__name__}, not a mapping of data options")
        record = dict(record)
        target = record.pop("_target_", None)
        if target is not None and target not in DATAMODULE_TARGETS:
            raise RecordError(f"{source}: data_config._target_={target!r:.120} is not the datamodule "
                              f"({DATAMODULE_TARGETS[-1]}); refusing to read a checkpoint that names other code")
        return from_record(cls, record, source, "data_config", version)
