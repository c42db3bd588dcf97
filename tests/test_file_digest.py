"""Caches keyed by content: a file replaced by another of the same size with its modification time kept
(``cp -p``, ``rsync -a``) is a new key, and an unchanged file is hashed once."""

import hashlib
import os
import shutil

import pytest

from transformer_nmt import file_digest
from transformer_nmt.file_digest import content_digest


def replace_keeping_size_and_time(path, text: str) -> None:
    """What ``cp -p other path`` does: new bytes at ``path``, its modification time put back."""
    stat = path.stat()
    assert len(text.encode()) == stat.st_size  # the case a (path, size, mtime) key misses
    other = path.with_name(path.name + ".other")
    other.write_text(text)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    shutil.copy2(other, path)  # cp -p
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_size == stat.st_size


def test_the_digest_is_the_bytes_sha256_hashed_once_per_version_of_the_file(tmp_path, monkeypatch):
    path, memos = tmp_path / "corpus.de", tmp_path / "memos"
    path.write_text("ein Hund\nzwei Katzen\n")
    assert content_digest(path, memos) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert not memos.exists()  # changed this instant: a write within the same ctime tick would keep its identity
    monkeypatch.setattr(file_digest, "RACY_NS", 0)  # as if it had been written long ago
    first = content_digest(path, memos)
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()
    hashed, sha256 = [], hashlib.sha256
    monkeypatch.setattr(file_digest.hashlib, "sha256",  # the content's hasher (the memo's name hashes a string)
                        lambda *a: sha256(*a) if a else hashed.append("content") or sha256())
    assert content_digest(path, memos) == first and hashed == []  # the memo: nothing read
    replace_keeping_size_and_time(path, "zwei Katzen\nein Hund\n")
    second = content_digest(path, memos)
    assert second == hashlib.sha256(b"zwei Katzen\nein Hund\n").hexdigest() != first
    assert len(hashed) == 1


def test_a_memo_that_cannot_be_read_or_written_costs_a_hash_not_a_wrong_answer(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(file_digest, "RACY_NS", 0)
    path, memos = tmp_path / "model.ckpt", tmp_path / "memos"
    path.write_bytes(b"\x00weights")
    expected = hashlib.sha256(b"\x00weights").hexdigest()
    content_digest(path, memos)
    [memo] = memos.iterdir()
    memo.write_text("not a digest\n")
    assert content_digest(path, memos) == expected  # recomputed, and the memo repaired
    assert memo.read_text() == expected + "\n"
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the memo directory should be")
    assert content_digest(path, blocked) == expected
    assert "could not record the digest" in capsys.readouterr().err


def test_the_corpus_caches_are_keyed_by_the_files_bytes(tmp_path):
    """The tokenized splits of a corpus whose file was replaced, same size and time, are built anew."""
    from transformer_nmt.data.config import DataConfig
    from transformer_nmt.data.datamodule import TranslationDataModule

    lines = {"en": [f"a small dog number {i} runs\n" for i in range(60)],
             "de": [f"ein kleiner Hund Nummer {i} rennt\n" for i in range(60)]}
    for split in ("train", "val"):
        for lang, text in lines.items():
            (tmp_path / f"{split}.{lang}").write_text("".join(text))

    def setup():
        data = TranslationDataModule(DataConfig(train=str(tmp_path / "train"), val=str(tmp_path / "val"), test=None,
                                                cache_dir=str(tmp_path / "cache"), vocab_size=60, num_proc=1))
        data.setup("fit")
        return data

    assert setup().references("val")[0] == "ein kleiner Hund Nummer 0 rennt"
    swapped = lines["de"][1:2] + lines["de"][0:1] + lines["de"][2:]
    replace_keeping_size_and_time(tmp_path / "val.de", "".join(swapped))
    assert setup().references("val")[:2] == ["ein kleiner Hund Nummer 1 rennt", "ein kleiner Hund Nummer 0 rennt"]


def test_the_ctranslate2_export_cache_is_keyed_by_the_checkpoints_bytes(tmp_path, monkeypatch):
    """A checkpoint replaced by another (another seed: same size, time kept) is exported anew; a copy of it shares
    the entry."""
    pytest.importorskip("ctranslate2")
    from tiny_checkpoint import tiny_tokenizer, write_checkpoint

    from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
    from transformer_nmt.inference.export import cached_export

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tokenizer = tiny_tokenizer(vocab_size=100)
    ckpt, other = tmp_path / "model.ckpt", tmp_path / "other.ckpt"
    write_checkpoint(ckpt, tokenizer, seed=0)
    write_checkpoint(other, tokenizer, seed=1)
    first = cached_export(ckpt)
    before = CTranslate2Model(first, threads=1).translate_ids([[5, 6, 7, 3]], beam=1)
    stat = ckpt.stat()
    assert other.stat().st_size == stat.st_size  # the case a (path, size, mtime) key misses
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    shutil.copy2(other, ckpt)  # cp -p
    second = cached_export(ckpt)
    assert second != first
    assert cached_export(other) == second  # the same bytes: the same entry
    after = CTranslate2Model(second, threads=1).translate_ids([[5, 6, 7, 3]], beam=1)
    assert after != before  # another model's output (seeds 0 and 1 differ on this input)
