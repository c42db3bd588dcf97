"""The LightningDataModule: raw pairs -> shared vocabulary -> token ids -> filtered token-bucket batches.

Every expensive step is cached under ``cache_dir`` in a directory named after a hash of its inputs:

    raw-{split}-{key}/pairs.arrow     the split's sentences, one column per language
    spm-{key}/spm.model              the SentencePiece model trained on the raw training split
    tok-{split}-{key}/*.arrow         token ids and lengths per language (key: raw split + model bytes)
    keep-{split}-{key}/*.npy          the pairs that pass the filter and their padded widths (key: tokens,
                                      direction, max_positions, max_length_ratio)

so a second run reads memory-mapped files and tokenizes nothing; changing ``max_positions`` refilters
without re-tokenizing. Every rank memory-maps the same files, so nothing that grows with the corpus is
copied per rank except the rank's own share of the epoch's batches. Each cache entry is built under a
file lock into a temporary directory that is renamed into place, so DDP ranks calling ``setup`` at the
same time build it once and never read a half-written one.

The options, their defaults and help live in one place, ``DataConfig`` (data/config.py); the corpus
locations (``train``, ``val``, ``test``) have no default.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from pathlib import Path

import datasets
import lightning as L
import numpy as np
import torch
from filelock import FileLock
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from transformer_nmt.data.batching import TokenBucketBatchSampler, pad_pairs, pair_widths
from transformer_nmt.data.config import DataConfig, TrainCorpus
from transformer_nmt.data.corpus import (
    FilterReport,
    both_sides,
    corpus_of,
    file_fingerprint,
    filter_pairs,
    split_inputs,
    write_split,
)
from transformer_nmt.data.language_tags import LeadWith, tag_in_text
from transformer_nmt.data.multilingual import MultilingualSplits
from transformer_nmt.data.split import Split
from transformer_nmt.data.subword_sampling import SampledSegmentation, take_rows
from transformer_nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    tokenize_dataset,
    train_sentencepiece,
)
from transformer_nmt.durable import publish_directory, temporary_directory
from transformer_nmt.hardware import available_cpus

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


# ------------------------------------------------------------------------------------------------ caching


def cache_key(*parts) -> str:
    """A short stable hash of JSON-serializable inputs."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_dir(path: Path, build: Callable[[Path], None]) -> bool:
    """Make sure directory ``path`` exists, building it with ``build(tmp_dir)`` if not. True if built.

    A file lock serializes builders (other processes wait, then find the result); the build writes into
    a fresh temporary directory beside ``path`` (``mkdtemp``) whose files are fsynced before it is renamed into
    place: after a crash an entry is complete or absent.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        return False
    with FileLock(str(path) + ".lock"):
        if path.is_dir():
            return False
        tmp = temporary_directory(path)
        try:
            build(tmp)
            publish_directory(tmp, path)  # every file fsynced, then the rename: never a half-written entry
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


# ------------------------------------------------------------------------------------------------ splits


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


class SampledPairDataset(PairDataset):
    """The training pairs in the segmentation of the epoch being read (subword sampling, data.spm_alpha):
    ``set_epoch`` says which; the ids come from ``SampledSegmentation``, not from the Arrow table."""

    def __init__(self, segmentation: SampledSegmentation, pad_to_multiple: int = 1):
        self.segmentation, self.pad_to_multiple, self.epoch = segmentation, pad_to_multiple, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.segmentation)

    def __getitem__(self, index: int) -> dict:
        (s_flat, s_off), (t_flat, t_off) = self.segmentation.epoch(self.epoch)
        return {"src": s_flat[s_off[index]:s_off[index + 1]].tolist(),
                "tgt": t_flat[t_off[index]:t_off[index + 1]].tolist(), "index": index}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        src, tgt = self.segmentation.epoch(self.epoch)
        return pad_pairs(take_rows(src, indices), take_rows(tgt, indices), indices, self.pad_to_multiple)


def _padded_already(batch: dict) -> dict:
    return batch


class ResumableDataLoader(DataLoader):
    """A DataLoader over a ``TokenBucketBatchSampler`` whose position Lightning can checkpoint.

    It counts the batches it has handed out (not those prefetched by workers), so ``state_dict()``
    (the sampler's position after them: epoch, batches per rank, number of ranks) lets a resumed run
    skip exactly what was consumed, with as many ranks or another number.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._epoch, self._dealt_before, self._consumed = self.batch_sampler.epoch, [], 0

    def __iter__(self):
        sampler = self.batch_sampler
        self._epoch, self._dealt_before, self._consumed = sampler.epoch, list(sampler.dealt_before), 0
        if hasattr(self.dataset, "set_epoch"):  # subword sampling: the ids of this epoch's segmentation
            self.dataset.set_epoch(sampler.epoch)
        for batch in super().__iter__():
            self._consumed += 1
            yield batch
        self._epoch, self._dealt_before, self._consumed = self._epoch + 1, [], 0

    def state_dict(self) -> dict:
        return self.batch_sampler.position(self._epoch, self._dealt_before, self._consumed)

    def load_state_dict(self, state: dict) -> None:
        sampler = self.batch_sampler
        sampler.load_state_dict(state)
        self._epoch, self._dealt_before, self._consumed = sampler.epoch, list(sampler.dealt_before), 0


# ------------------------------------------------------------------------------------------------ module


class TranslationDataModule(MultilingualSplits, L.LightningDataModule):
    """Train/val/test loaders of token-bucketed translation batches (see the module docstring).

    Batches are dicts of LongTensors: "src" (B, S) source ids + eos, "tgt" (B, T) bos + target ids + eos,
    both right-padded with pad_id 0, and "index" (B,) the pair's index in its filtered split
    (``references(split)[i]`` is its raw target sentence).
    """

    def __init__(self, config: DataConfig | Mapping, *, seed: int | None = None, pad_to_multiple: int | None = None,
                 tokenizer: Tokenizer | None = None):
        """``config``: the data options (a ``DataConfig``, or the app's ``data`` node); ``seed`` and
        ``pad_to_multiple``, where given, replace the config's: the app passes the run's batch seed and the
        multiple train.compile needs. ``tokenizer``: use it instead of data.tokenizer_path or a trained one (the
        app passes init_from's)."""
        super().__init__()
        if not isinstance(config, DataConfig):
            config = DataConfig(**(OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig)
                                   else config))
        self.config = config
        self.spec = config.corpus_spec()
        self.src_lang, self.tgt_lang = config.src_lang, config.tgt_lang
        self.cache_dir = Path(config.cache_dir)
        self.tokenizer_path = config.tokenizer_path
        self.vocab_options = {"vocab_size": config.vocab_size, "model_type": config.spm_model_type,
                              "input_sentence_size": config.input_sentence_size,
                              "character_coverage": config.character_coverage, "seed": config.vocab_seed}
        self.max_tokens = config.max_tokens
        self.eval_max_tokens = config.eval_max_tokens or config.max_tokens
        self.max_positions, self.max_length_ratio = config.max_positions, config.max_length_ratio
        # Batch order; None (data.seed=null): the app passes the run's seed; a datamodule built alone uses 0.
        seed = config.seed if seed is None else seed
        self.seed = 0 if seed is None else seed
        self.num_proc, self.num_workers = config.num_proc, config.num_workers
        # batch widths rounded up to a multiple of this (train.compile: 8)
        self.pad_to_multiple = config.pad_to_multiple if pad_to_multiple is None else pad_to_multiple
        self.given_tokenizer = tokenizer
        self.tokenizer: Tokenizer | None = None
        self.tokenizer_trained_now = False
        self.tokenizer_path_used: Path | None = None
        self.splits: dict[str, Split] = {}
        self._samplers: dict[str, TokenBucketBatchSampler] = {}
        self._segmentation: SampledSegmentation | None = None
        self.pair_specs = config.pair_specs()  # data.pairs: each pair's corpora; {}: the one pair src_lang-tgt_lang
        if self.pair_specs:  # the splits' columns: each pair's source and target under one name (multilingual.py)
            self.src_lang, self.tgt_lang = "src", "tgt"

    # -------------------------------------------------------------------------------------------- setup

    def setup(self, stage: str | None = None) -> None:
        """Build or reuse the vocabulary and the tokenized splits; filter them and log what was dropped."""
        if self.splits:
            return
        configured = [s for s in self.spec.locations if self.spec.locations.get(s)]  # train, val(s), test
        if "train" not in configured and self.tokenizer_path is None and self.given_tokenizer is None:
            raise ValueError("data.train is not set: the vocabulary is trained on it (or set data.tokenizer_path)")
        if self.pair_specs:
            return self._setup_pairs(configured)
        corpora = self.config.train_corpora() if "train" in configured else []
        train_raw = [self._raw_split("train", corpus.location) for corpus in corpora]  # one per corpus, first
        self._check_tags_absent(corpora, train_raw)
        raw = {split: self._raw_split(split) for split in configured if split != "train"}
        self.tokenizer = self._tokenizer(train_raw, [corpus.tag for corpus in corpora])
        tag_ids = self._tag_ids([corpus.tag for corpus in corpora])
        for split in configured:
            self.splits[split] = (self._training_split(corpora, train_raw, tag_ids) if split == "train" else
                                  self._tokenized_split(split, *raw[split]))
            report = self.splits[split].report
            (log.warning if report.utf8_replaced_lines or report.control_replaced_sentences else log.info)(str(report))

    def _raw_split(self, split: str, location: str | None = None, spec=None) -> tuple[datasets.Dataset, str, dict]:
        """The split's sentences (memory-mapped), their cache key, and what reading them cleaned; ``location``:
        one corpus of a split given as several (data.train=[A,B,...]); ``spec``: one pair's (data.pairs)."""
        spec = spec or (self.spec if location is None else corpus_of(self.spec, split, location))
        inputs = split_inputs(spec, split)
        key = cache_key("raw", spec.format, sorted(spec.langs), spec.columns, spec.utf8_errors, spec.control_chars,
                        spec.hub_name, spec.hub_config, spec.locations[split], file_fingerprint(sorted(inputs)))
        path = self.cache_dir / f"raw-{split}-{key}"

        def build(tmp: Path):
            stats = write_split(spec, split, tmp / "pairs.arrow")
            (tmp / "meta.json").write_text(json.dumps({
                "pairs": stats.pairs, "inputs": inputs, "utf8_replaced_lines": stats.utf8_replaced_lines,
                "control_replaced_sentences": stats.control_replaced_sentences}))

        cached_dir(path, build)
        meta = json.loads((path / "meta.json").read_text())
        cleaned = {k: meta.get(k, 0) for k in ("utf8_replaced_lines", "control_replaced_sentences")}
        return datasets.Dataset.from_file(str(path / "pairs.arrow")), key, cleaned

    def _tokenizer(self, train: list[tuple[datasets.Dataset, str, dict]], tags: list[str | None],
                   sides: list[tuple[datasets.Dataset, str]] | None = None) -> Tokenizer:
        """The given tokenizer, data.tokenizer_path's, or one trained on every training corpus (both languages; or
        ``sides``: these (corpus, language) columns, each language of data.pairs once), holding each tag whole."""
        if self.given_tokenizer is not None:
            return self.given_tokenizer
        if self.tokenizer_path is not None:
            self.tokenizer_path_used = Path(self.tokenizer_path)
            return self._given_tokenizer(self.tokenizer_path_used)
        raws = [raw for raw, _, _ in train]
        raw = raws[0] if len(raws) == 1 else datasets.concatenate_datasets(raws)
        raw_key = train[0][1] if len(train) == 1 else [key for _, key, _ in train]  # one corpus: the key as before
        if sides is not None:
            raw_key = [raw_key, [lang for _, lang in sides]]
        symbols = sorted({tag for tag in tags if tag})
        options = {**self.vocab_options, **({"user_defined_symbols": symbols} if symbols else {})}
        path = self.cache_dir / f"spm-{cache_key('spm', raw_key, options)}"

        def build(tmp: Path):
            log.info("training a shared SentencePiece vocabulary (%s) on %d pairs", options, len(raw))
            sentences = (both_sides(raw, sorted(self.spec.langs)) if sides is None else
                         (text for side, lang in sides for text in side.data.column(lang).to_pylist() if text))
            tokenizer = train_sentencepiece(sentences, num_threads=available_cpus(), **options)
            tokenizer.save(tmp / "spm.model")
            (tmp / "meta.json").write_text(json.dumps({**options, "trained_vocab_size":
                                                       tokenizer.vocab_size, "train_pairs": len(raw)}))

        self.tokenizer_trained_now = cached_dir(path, build)
        self.tokenizer_path_used = path / "spm.model"
        if not self.tokenizer_trained_now:
            log.info("reusing vocabulary %s", self.tokenizer_path_used)
        return Tokenizer.load(self.tokenizer_path_used)

    def _given_tokenizer(self, path: Path) -> Tokenizer:
        """The SentencePiece model ``data.tokenizer_path`` names, or an error naming the option and the file."""
        option = f"data.tokenizer_path={self.tokenizer_path}"
        if not path.is_file():
            raise ValueError(f"{option}: no such file (resolved to {path.absolute()}); give a SentencePiece model "
                             f"file, or data.tokenizer_path=null to train one on data.train")
        try:
            return Tokenizer.load(path)
        except (RuntimeError, ValueError) as error:  # SentencePiece's parser, or the special ids
            raise ValueError(f"{option}: {path} is not a usable SentencePiece model "
                             f"({str(error).strip().splitlines()[0][:200]}); give a .model file written by "
                             f"SentencePiece with ids pad 0, unk 1, bos 2, eos 3, or data.tokenizer_path=null to "
                             f"train one on data.train") from None

    def _tag_ids(self, tags: list[str | None]) -> list[int]:
        """The vocabulary id of each corpus's source tag (-1: untagged); a tag the vocabulary does not hold as
        one piece (data.tokenizer_path's, init_from's), or holds as a special piece, is refused, naming it."""
        ids = []
        specials = {self.tokenizer.id_to_piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)} | {"<unk>"}
        for tag in tags:
            if tag in specials:
                raise ValueError(f"data.train_tags: {tag!r} is one of the vocabulary's special pieces "
                                 f"({sorted(specials)}): choose another tag (e.g. <BT>)")
            token_id = self.tokenizer.piece_id(tag) if tag else -1
            if token_id is None:
                where = (f"data.tokenizer_path={self.tokenizer_path}" if self.given_tokenizer is None
                         else "the vocabulary given (init_from's)")
                raise ValueError(f"data.train_tags: {tag!r} is not a piece of {where}: a tag must be one piece. "
                                 f"Train the vocabulary with the tags (data.tokenizer_path=null), or use a piece "
                                 f"it holds")
            ids.append(token_id)
        return ids

    def _check_tags_absent(self, corpora: list[TrainCorpus], train_raw: list) -> None:
        """A tag is a token the corpora never contain: one that occurs in their text (``in``) would be cut out of
        every word holding it, in training and in every sentence given to translate. The text is compared as
        SentencePiece matches it, after NFKC normalization (its ``nmt_nfkc``: ``＜BT＞`` is ``<BT>`` there)."""
        for tag in sorted({corpus.tag for corpus in corpora if corpus.tag}):
            for corpus, (raw, _, _) in zip(corpora, train_raw):
                for lang in self.spec.langs:
                    if tag_in_text(raw.data.column(lang), [tag]):
                        raise ValueError(f"data.train_tags: {tag!r} occurs in the {lang} text of data.train corpus "
                                         f"{corpus.location}: a tag must be a token no sentence holds (e.g. <BT>; "
                                         f"the text is compared after NFKC normalization, as SentencePiece reads it)")

    def _tokens(self, split: str, raw: datasets.Dataset, raw_key: str,
                langs: tuple[str, str] | None = None) -> tuple[datasets.Dataset, str, bool]:
        """The split's token ids (memory-mapped), their cache key, and whether they were tokenized now; ``langs``:
        one pair's (source, target) of data.pairs."""
        model_hash = self.tokenizer.digest()  # a single SentencePiece model: its sha256, as before
        tok_key = cache_key("tok", raw_key, model_hash, *([list(langs)] if langs else []))
        path = self.cache_dir / f"tok-{split}-{tok_key}"

        def build(tmp: Path):
            tokens = tokenize_dataset(raw, self.tokenizer, langs or self.spec.langs, tmp / "tokens.arrow",
                                      self.num_proc)
            shards = [Path(f["filename"]).name for f in tokens.cache_files]
            (tmp / "manifest.json").write_text(json.dumps({"shards": shards, "pairs": len(tokens)}))

        tokenized_now = cached_dir(path, build)
        return self._shards(path), tok_key, tokenized_now

    @staticmethod
    def _shards(path: Path) -> datasets.Dataset:
        manifest = json.loads((path / "manifest.json").read_text())
        shards = [datasets.Dataset.from_file(str(path / name)) for name in manifest["shards"]]
        return shards[0] if len(shards) == 1 else datasets.concatenate_datasets(shards)

    def _tokenized_split(self, split: str, raw: datasets.Dataset, raw_key: str, cleaned: dict) -> Split:
        tokens, tok_key, tokenized_now = self._tokens(split, raw, raw_key)
        keep, widths, report = self._filtered(split, tokens, tok_key)
        self._check_kept(split, keep, report)
        return Split(split, raw, tokens, keep, widths, replace(report, **cleaned), tokenized_now)

    @staticmethod
    def _check_kept(split: str, keep: np.ndarray, report: FilterReport) -> None:
        if len(keep) == 0:
            raise ValueError(f"data.{split}: no pairs left after filtering ({report}); check the data and "
                             f"data.max_positions / data.max_length_ratio")

    def _training_split(self, corpora: list[TrainCorpus], train_raw: list, tag_ids: list[int]) -> Split:
        """The training split: one corpus as any split, or several (data.train=[A,B,...]) read as one table in
        their order, each corpus's sources led by its tag's id, filtered together, then each corpus's kept pairs
        repeated ``upsample`` times (``Split.keep`` lists a pair once per time it enters an epoch)."""
        if len(corpora) == 1 and tag_ids[0] < 0 and corpora[0].upsample == 1:
            return self._tokenized_split("train", *train_raw[0])
        untagged, parts, keys, tokenized_now = [], [], [], False
        for (raw, raw_key, _), tag_id in zip(train_raw, tag_ids):
            tokens, tok_key, now = self._tokens("train", raw, raw_key)
            untagged.append(tokens)
            keys.append(tok_key)
            parts.append(self._tagged(tokens, tok_key, tag_id)[0] if tag_id >= 0 else tokens)
            tokenized_now |= now
        tokens = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        raws = [raw for raw, _, _ in train_raw]
        raw = raws[0] if len(raws) == 1 else datasets.concatenate_datasets(raws)
        # filtered as each corpus's own pairs (a tag makes no empty source non-empty, nor counts in the ratio) ...
        whole = untagged[0] if len(untagged) == 1 else datasets.concatenate_datasets(untagged)
        keep, _, report = self._filtered("train", whole, cache_key("train", keys))
        starts = np.cumsum([0] + [len(part) for part in parts])  # (n_corpora + 1,) first row of each corpus
        corpus_of_kept = np.searchsorted(starts, keep, side="right") - 1  # (n_kept,)
        # ... but a tagged source must still fit the positions with its tag, and batches are sized with it
        src_lens = tokens.data.column(f"{self.src_lang}_len").to_numpy()
        tgt_lens = tokens.data.column(f"{self.tgt_lang}_len").to_numpy()
        fits = src_lens[keep] + 1 <= self.max_positions  # (n_kept,) source + eos
        if not fits.all():
            log.info("train: %d tagged pair(s) dropped: with the tag the source is longer than data.max_positions",
                     int((~fits).sum()))
            keep, corpus_of_kept = np.asarray(keep)[fits], corpus_of_kept[fits]
            report = replace(report, too_long=report.too_long + int((~fits).sum()))
        self._check_kept("train", keep, report)
        widths = pair_widths(src_lens[keep], tgt_lens[keep])
        rows = [np.flatnonzero(corpus_of_kept == i) for i in range(len(parts))]  # kept positions per corpus
        order = np.concatenate([np.tile(positions, corpus.upsample) for positions, corpus in zip(rows, corpora)])
        tags = np.asarray(tag_ids, dtype=np.int64)[corpus_of_kept[order]]
        cleaned = {k: sum(r[2].get(k, 0) for r in train_raw)
                   for k in ("utf8_replaced_lines", "control_replaced_sentences")}
        log.info("train: %s; %s pairs per epoch", "; ".join(
            f"{corpus.location}: {len(positions):,} pairs kept"
            + (f", source tag {corpus.tag}" if corpus.tag else "") + (f", x{corpus.upsample}" if corpus.upsample > 1
                                                                       else "")
            for corpus, positions in zip(corpora, rows)), f"{len(order):,}")
        return Split("train", raw, tokens, np.asarray(keep)[order], np.asarray(widths)[order],
                     replace(report, **cleaned), tokenized_now, source_tags=tags if (tags >= 0).any() else None)

    def _tagged(self, tokens: datasets.Dataset, tok_key: str, tag_id: int, lang: str | None = None,
                split: str = "train") -> tuple[datasets.Dataset, str]:
        """``tokens`` with ``tag_id`` before every source sentence's ids (``lang``: that column's; cached,
        memory-mapped), and its key."""
        lang = lang or self.src_lang
        key = cache_key("tagged", tok_key, lang, tag_id)
        path = self.cache_dir / f"tagged-{split}-{key}"
        ids_column, len_column = f"{lang}_ids", f"{lang}_len"

        def build(tmp: Path):
            tagged = tokens.with_format("arrow").map(
                LeadWith(tag_id, ids_column, len_column), batched=True, batch_size=10_000,
                cache_file_name=str(tmp / "tokens.arrow"), load_from_cache_file=False, desc="tagging").with_format(None)
            shards = [Path(f["filename"]).name for f in tagged.cache_files]
            (tmp / "manifest.json").write_text(json.dumps({"shards": shards, "pairs": len(tagged)}))

        cached_dir(path, build)
        return self._shards(path), key

    def _filtered(self, split: str, tokens: datasets.Dataset, tok_key: str, langs: tuple[str, str] | None = None):
        """(kept rows, their padded widths, the filter report), cached and memory-mapped (shared by ranks);
        ``langs``: the columns' (source, target) where not the datamodule's (one pair of data.pairs)."""
        ratio = self.max_length_ratio if split == "train" else None  # never drop eval pairs for their ratio
        src_lang, tgt_lang = langs or (self.src_lang, self.tgt_lang)
        key = cache_key("keep", tok_key, src_lang, tgt_lang, self.max_positions, ratio)
        path = self.cache_dir / f"keep-{split}-{key}"

        def build(tmp: Path):
            src_lens = tokens.data.column(f"{src_lang}_len").to_numpy()
            tgt_lens = tokens.data.column(f"{tgt_lang}_len").to_numpy()
            keep, report = filter_pairs(split, src_lens, tgt_lens, self.max_positions, ratio)
            np.save(tmp / "keep.npy", keep.astype(np.int32 if len(src_lens) < 2**31 else np.int64))
            np.save(tmp / "widths.npy", pair_widths(src_lens[keep], tgt_lens[keep]))
            (tmp / "report.json").write_text(json.dumps(asdict(report)))

        cached_dir(path, build)
        report = FilterReport(**json.loads((path / "report.json").read_text()))
        return np.load(path / "keep.npy", mmap_mode="r"), np.load(path / "widths.npy", mmap_mode="r"), report

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

    def segmentation(self) -> SampledSegmentation | None:
        """The training split's sampled segmentations (data.spm_alpha > 0), built once; None when off."""
        if not self.config.spm_alpha:
            return None
        if self._segmentation is None:
            if self.num_workers:
                raise ValueError("data.spm_alpha > 0 reads each epoch's segmentation in the main process: set "
                                 "data.num_workers=0")
            s = self._split("train")
            fallback = tuple(self._kept_ids(s, lang) for lang in (self.src_lang, self.tgt_lang))
            self._segmentation = SampledSegmentation(self.tokenizer, self.sources("train"), self.references("train"),
                                                     self.config.spm_alpha, self.seed, self.max_positions, fallback,
                                                     source_tags=s.source_tags,  # the widest pair a batch holds:
                                                     max_width=self.max_tokens // self.pad_to_multiple
                                                     * self.pad_to_multiple)
        return self._segmentation

    @staticmethod
    def _kept_ids(s: Split, lang: str):
        """The deterministic ids of the kept pairs of a split, one language, as a ragged array."""
        ids = s.tokens.data.column(f"{lang}_ids").take(s.keep).combine_chunks()
        offsets = ids.offsets.to_numpy().astype(np.int64)
        return ids.flatten().to_numpy(), offsets - offsets[0]

    def batch_sampler(self, split: str) -> TokenBucketBatchSampler:
        """The split's batch sampler, for this process's rank (trainer attached) or a single process."""
        s = self._split(split)
        trainer = getattr(self, "trainer", None)
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        train = split == "train"
        segmentation = self.segmentation() if train else None
        return TokenBucketBatchSampler(s.widths, self.max_tokens if train else self.eval_max_tokens,
                                       shuffle=train, seed=self.seed, num_replicas=replicas, rank=rank,
                                       pad_to_multiple=self.pad_to_multiple,
                                       epoch_widths=segmentation.widths if segmentation is not None else None,
                                       epoch_members=s.draw.members if train and s.draw is not None else None)

    def dataloader(self, split: str) -> ResumableDataLoader:
        s = self._split(split)
        device = getattr(getattr(getattr(self, "trainer", None), "strategy", None), "root_device", None)
        segmentation = self.segmentation() if split == "train" else None
        return ResumableDataLoader(
            SampledPairDataset(segmentation, self.pad_to_multiple) if segmentation is not None else
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

    def val_dataloader(self) -> ResumableDataLoader | list[ResumableDataLoader]:
        """The validation set's loader; with several (data.val=[A,B]), one each, in ``val_splits`` order."""
        splits = self.val_splits()
        return self.dataloader("val") if len(splits) == 1 else [self.dataloader(split) for split in splits]

    def val_splits(self) -> list[str]:
        """The names of the validation sets (``DataConfig.val_splits``): val, val_NAME, ..."""
        return self.config.val_splits()

    def test_dataloader(self) -> ResumableDataLoader:
        return self.dataloader("test")

