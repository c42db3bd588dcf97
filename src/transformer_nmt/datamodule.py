"""The LightningDataModule: raw pairs -> shared vocabulary -> token ids -> filtered token-bucket batches.

Every expensive step is cached under ``cache_dir`` in a directory named after a hash of its inputs:

    raw-{split}-{key}/pairs.arrow     the split's sentences, one column per language
    spm-{key}/spm.model              the SentencePiece model trained on the raw training split
    tok-{split}-{key}/*.arrow         token ids and lengths per language (key: raw split + model bytes)

so a second run reads memory-mapped Arrow files and tokenizes nothing. Filtering is cheap (lengths only)
and is redone each run, so changing ``max_positions`` does not re-tokenize. Each cache entry is built
under a file lock into a temporary directory that is renamed into place, so DDP ranks calling ``setup``
at the same time build it once and never read a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import datasets
import lightning as L
import numpy as np
import torch
from filelock import FileLock
from torch.utils.data import DataLoader

from transformer_nmt.batching import TokenBucketBatchSampler, pad_pairs
from transformer_nmt.corpus import (CorpusSpec, FilterReport, both_sides, file_fingerprint, filter_pairs, split_inputs,
                                   write_split)
from transformer_nmt.tokenizer import Tokenizer, tokenize_dataset, train_sentencepiece

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


# ------------------------------------------------------------------------------------------------ caching


def cache_key(*parts) -> str:
    """A short stable hash of JSON-serializable inputs."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_dir(path: Path, build: Callable[[Path], None]) -> bool:
    """Make sure directory ``path`` exists, building it with ``build(tmp_dir)`` if not. True if built.

    A file lock serializes builders (other processes wait, then find the result); the build writes into
    a temporary directory beside ``path`` that is renamed into place only once complete.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        return False
    with FileLock(str(path) + ".lock"):
        if path.is_dir():
            return False
        tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
        try:
            build(tmp)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


# ------------------------------------------------------------------------------------------------ splits


@dataclass
class Split:
    """One prepared split: raw sentences, token ids, and which pairs survive filtering."""

    name: str
    raw: datasets.Dataset  # columns {lang}: string
    tokens: datasets.Dataset  # columns {lang}_ids: list<int32>, {lang}_len: int32
    keep: np.ndarray  # (n_kept,) row of the raw/token tables for each filtered index
    report: FilterReport
    tokenized_now: bool  # False when the token ids came from the cache

    def lengths(self, lang: str) -> np.ndarray:
        return self.tokens.data.column(f"{lang}_len").to_numpy()[self.keep]


class PairDataset(torch.utils.data.Dataset):
    """Filtered pairs of one split; ``__getitems__`` gathers a whole batch from Arrow and pads it."""

    def __init__(self, tokens: datasets.Dataset, keep: np.ndarray, src_lang: str, tgt_lang: str,
                 pad_to_multiple: int = 1):
        self.tokens, self.keep, self.pad_to_multiple = tokens.with_format("arrow"), keep, pad_to_multiple
        self.columns = (f"{src_lang}_ids", f"{tgt_lang}_ids")

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, index: int) -> dict:
        row = self.tokens[int(self.keep[index])]
        return {"src": row.column(self.columns[0])[0].as_py(), "tgt": row.column(self.columns[1])[0].as_py(),
                "index": index}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        table = self.tokens[self.keep[indices].tolist()]
        ragged = []
        for column in self.columns:
            ids = table.column(column).combine_chunks()
            offsets = ids.offsets.to_numpy()
            ragged.append((ids.flatten().to_numpy(), offsets - offsets[0]))
        return pad_pairs(ragged[0], ragged[1], indices, self.pad_to_multiple)


def _padded_already(batch: dict) -> dict:
    return batch


class ResumableDataLoader(DataLoader):
    """A DataLoader over a ``TokenBucketBatchSampler`` whose position Lightning can checkpoint.

    It counts the batches it has handed out (not those prefetched by workers), so
    ``state_dict()`` = {epoch, batches_yielded} lets a resumed run skip exactly what was consumed.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._epoch, self._consumed = self.batch_sampler.epoch, 0

    def __iter__(self):
        sampler = self.batch_sampler
        self._epoch, self._consumed = sampler.epoch, sampler.pending_skip
        for batch in super().__iter__():
            self._consumed += 1
            yield batch
        self._epoch, self._consumed = self._epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "batches_yielded": self._consumed, "seed": self.batch_sampler.seed}

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state)
        self._epoch, self._consumed = state["epoch"], state["batches_yielded"]


# ------------------------------------------------------------------------------------------------ module


class TranslationDataModule(L.LightningDataModule):
    """Train/val/test loaders of token-bucketed translation batches (see the module docstring).

    Batches are dicts of LongTensors: "src" (B, S) source ids + eos, "tgt" (B, T) bos + target ids + eos,
    both right-padded with pad_id 0, and "index" (B,) the pair's index in its filtered split
    (``references(split)[i]`` is its raw target sentence).
    """

    def __init__(
        self,
        format: str = "text",
        src_lang: str = "en",
        tgt_lang: str = "de",
        train: str | None = "data/multi30k/train",
        val: str | None = "data/multi30k/val",
        test: str | None = "data/multi30k/test_2016_flickr",
        columns: list[str] | None = None,
        hub_name: str | None = None,
        hub_config: str | None = None,
        utf8_errors: str = "strict",
        cache_dir: str = "data/cache",
        tokenizer_path: str | None = None,
        vocab_size: int = 8000,
        spm_model_type: str = "bpe",
        input_sentence_size: int = 2_000_000,
        character_coverage: float = 1.0,
        max_tokens: int = 4096,
        eval_max_tokens: int | None = None,
        max_positions: int = 256,
        max_length_ratio: float | None = 3.0,
        seed: int = 1234,
        num_proc: int = 1,
        num_workers: int = 0,
        pad_to_multiple: int = 1,
    ):
        super().__init__()
        self.spec = CorpusSpec(
            format=format,
            langs=(src_lang, tgt_lang),
            locations={"train": train, "val": val, "test": test},
            columns=tuple(columns) if columns else None,
            hub_name=hub_name,
            hub_config=hub_config,
            utf8_errors=utf8_errors,
        )
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.cache_dir = Path(cache_dir)
        self.tokenizer_path = tokenizer_path
        self.vocab_options = {"vocab_size": vocab_size, "model_type": spm_model_type,
                              "input_sentence_size": input_sentence_size,
                              "character_coverage": character_coverage, "seed": seed}
        self.max_tokens, self.eval_max_tokens = max_tokens, eval_max_tokens or max_tokens
        self.max_positions, self.max_length_ratio = max_positions, max_length_ratio
        self.seed, self.num_proc, self.num_workers = seed, num_proc, num_workers
        self.pad_to_multiple = pad_to_multiple  # batch widths rounded up to a multiple of this (train.compile: 8)
        self.tokenizer: Tokenizer | None = None
        self.tokenizer_trained_now = False
        self.tokenizer_path_used: Path | None = None
        self.splits: dict[str, Split] = {}
        self._samplers: dict[str, TokenBucketBatchSampler] = {}

    # -------------------------------------------------------------------------------------------- setup

    def setup(self, stage: str | None = None) -> None:
        """Build or reuse the vocabulary and the tokenized splits; filter them and log what was dropped."""
        if self.splits:
            return
        configured = [s for s in SPLITS if self.spec.locations.get(s)]
        if "train" not in configured and self.tokenizer_path is None:
            raise ValueError("data.train is not set: the vocabulary is trained on it (or set data.tokenizer_path)")
        raw = {split: self._raw_split(split) for split in configured}
        self.tokenizer = self._tokenizer(raw.get("train"))
        for split in configured:
            self.splits[split] = self._tokenized_split(split, *raw[split])
            log.info(str(self.splits[split].report))

    def _raw_split(self, split: str) -> tuple[datasets.Dataset, str]:
        inputs = split_inputs(self.spec, split)
        key = cache_key("raw", self.spec.format, sorted(self.spec.langs), self.spec.columns, self.spec.utf8_errors,
                        self.spec.hub_name, self.spec.hub_config, self.spec.locations[split],
                        file_fingerprint(sorted(inputs)))
        path = self.cache_dir / f"raw-{split}-{key}"

        def build(tmp: Path):
            stats = write_split(self.spec, split, tmp / "pairs.arrow")
            if stats.utf8_replaced_lines:
                log.warning("%s: replaced invalid UTF-8 in %d lines (data.utf8_errors=replace)",
                            split, stats.utf8_replaced_lines)
            (tmp / "meta.json").write_text(json.dumps({"pairs": stats.pairs, "inputs": inputs,
                                                       "utf8_replaced_lines": stats.utf8_replaced_lines}))

        cached_dir(path, build)
        return datasets.Dataset.from_file(str(path / "pairs.arrow")), key

    def _tokenizer(self, train: tuple[datasets.Dataset, str] | None) -> Tokenizer:
        if self.tokenizer_path is not None:
            self.tokenizer_path_used = Path(self.tokenizer_path)
            return Tokenizer.load(self.tokenizer_path)
        raw, raw_key = train
        path = self.cache_dir / f"spm-{cache_key('spm', raw_key, self.vocab_options)}"

        def build(tmp: Path):
            log.info("training a shared SentencePiece vocabulary (%s) on %d pairs", self.vocab_options, len(raw))
            tokenizer = train_sentencepiece(both_sides(raw, sorted(self.spec.langs)), num_threads=_cpus(),
                                            **self.vocab_options)
            tokenizer.save(tmp / "spm.model")
            (tmp / "meta.json").write_text(json.dumps({**self.vocab_options, "trained_vocab_size":
                                                       tokenizer.vocab_size, "train_pairs": len(raw)}))

        self.tokenizer_trained_now = cached_dir(path, build)
        self.tokenizer_path_used = path / "spm.model"
        if not self.tokenizer_trained_now:
            log.info("reusing vocabulary %s", self.tokenizer_path_used)
        return Tokenizer.load(self.tokenizer_path_used)

    def _tokenized_split(self, split: str, raw: datasets.Dataset, raw_key: str) -> Split:
        model_hash = hashlib.sha256(self.tokenizer.model_proto).hexdigest()
        path = self.cache_dir / f"tok-{split}-{cache_key('tok', raw_key, model_hash)}"

        def build(tmp: Path):
            tokens = tokenize_dataset(raw, self.tokenizer, self.spec.langs, tmp / "tokens.arrow", self.num_proc)
            shards = [Path(f["filename"]).name for f in tokens.cache_files]
            (tmp / "manifest.json").write_text(json.dumps({"shards": shards, "pairs": len(tokens)}))

        tokenized_now = cached_dir(path, build)
        manifest = json.loads((path / "manifest.json").read_text())
        shards = [datasets.Dataset.from_file(str(path / name)) for name in manifest["shards"]]
        tokens = shards[0] if len(shards) == 1 else datasets.concatenate_datasets(shards)
        src_lens = tokens.data.column(f"{self.src_lang}_len").to_numpy()
        tgt_lens = tokens.data.column(f"{self.tgt_lang}_len").to_numpy()
        ratio = self.max_length_ratio if split == "train" else None  # never drop eval pairs for their ratio
        keep, report = filter_pairs(split, src_lens, tgt_lens, self.max_positions, ratio)
        if len(keep) == 0:
            raise ValueError(f"data.{split}: no pairs left after filtering ({report}); check the data and "
                             f"data.max_positions / data.max_length_ratio")
        return Split(split, raw, tokens, keep, report, tokenized_now)

    # -------------------------------------------------------------------------------------------- access

    def _split(self, split: str) -> Split:
        if split not in self.splits:
            raise KeyError(f"split {split!r} is not prepared: call setup() first, and set data.{split}")
        return self.splits[split]

    def references(self, split: str) -> list[str]:
        """Raw target sentences of the filtered split; item i belongs to the pair with batch["index"] == i."""
        s = self._split(split)
        return s.raw.data.column(self.tgt_lang).take(s.keep).to_pylist()

    def sources(self, split: str) -> list[str]:
        """Raw source sentences of the filtered split, aligned like ``references``."""
        s = self._split(split)
        return s.raw.data.column(self.src_lang).take(s.keep).to_pylist()

    def batch_sampler(self, split: str) -> TokenBucketBatchSampler:
        """The split's batch sampler, for this process's rank (trainer attached) or a single process."""
        s = self._split(split)
        trainer = getattr(self, "trainer", None)
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        train = split == "train"
        return TokenBucketBatchSampler(s.lengths(self.src_lang), s.lengths(self.tgt_lang),
                                       self.max_tokens if train else self.eval_max_tokens,
                                       shuffle=train, seed=self.seed, num_replicas=replicas, rank=rank,
                                       pad_to_multiple=self.pad_to_multiple)

    def dataloader(self, split: str) -> ResumableDataLoader:
        s = self._split(split)
        device = getattr(getattr(getattr(self, "trainer", None), "strategy", None), "root_device", None)
        return ResumableDataLoader(
            PairDataset(s.tokens, s.keep, self.src_lang, self.tgt_lang, self.pad_to_multiple),
            batch_sampler=self.batch_sampler(split),
            collate_fn=_padded_already,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # Page-locked batches: Lightning's non_blocking copy to the GPU then overlaps the step.
            pin_memory=device is not None and device.type == "cuda",
        )

    def train_dataloader(self) -> ResumableDataLoader:
        return self.dataloader("train")

    def val_dataloader(self) -> ResumableDataLoader:
        return self.dataloader("val")

    def test_dataloader(self) -> ResumableDataLoader:
        return self.dataloader("test")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
