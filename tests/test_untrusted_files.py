"""Files from outside are data. A checkpoint or a CTranslate2 export whose configs name code (``_target_``,
``_partial_``, a nested ``_target_`` in a value) makes ``evaluate split=test`` refuse with an error naming the
file, ``translate`` never reads them, and nothing named is ever called; Lightning's own loads are weights-only;
a newer version's field is named with the version; temporary names are the writer's own; what is published is
fsynced before its rename; a truncated export is refused, and rebuilt in the cache."""

import dataclasses
import json
import os
import stat
from pathlib import Path

import hydra._internal.utils
import hydra.utils
import pytest
import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import (
    CKPT_DATA_CONFIG,
    CKPT_MODEL_CONFIG,
    CKPT_VERSION,
    CheckpointError,
    atomic_torch_save,
    load_checkpoint,
    read_checkpoint,
)
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import cached_dir
from transformer_nmt.durable import umask
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.training.app import build_trainer
from transformer_nmt.training.checkpoint_io import AtomicCheckpointIO

KEPT = "the user's file, which nothing may change\n"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(vocab_size=100)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"), n_train=4, n_eval=3)


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text(KEPT)
    return path


@pytest.fixture
def nothing_is_instantiated(monkeypatch):
    """Hydra's instantiate and its class lookup fail the test if anything calls them."""
    def called(*args, **kwargs):
        raise AssertionError(f"called with {args} {kwargs}")
    for module, name in ((hydra.utils, "instantiate"), (hydra.utils, "get_class"), (hydra.utils, "get_method"),
                         (hydra._internal.utils, "_locate")):
        monkeypatch.setattr(module, name, called)


def data_options(corpus) -> dict:
    """A data config as a training checkpoint records it (every option, resolved)."""
    return dataclasses.asdict(DataConfig(train=f"{corpus}/train", val=f"{corpus}/val", test=f"{corpus}/test"))


# (name, crafted data_config of a checkpoint given its victim and corpus, what the error names)
CRAFTED = [
    ("builtins.open", lambda v, c: {"_target_": "builtins.open", "_args_": [str(v), "w"]},
     r"data_config._target_='builtins.open' is not the datamodule"),
    ("shutil.copyfile", lambda v, c: {"_target_": "shutil.copyfile", "src": os.devnull, "dst": str(v)},
     r"data_config._target_='shutil.copyfile' is not the datamodule"),
    ("pathlib.Path.touch", lambda v, c: {"_target_": "pathlib.Path.touch", "_args_": [str(v.with_name("new"))]},
     r"data_config._target_='pathlib.Path.touch'"),
    ("_partial_", lambda v, c: {**data_options(c), "_target_": "transformer_nmt.data.datamodule.TranslationDataModule",
                                "_partial_": True},
     r"data_config has fields this transformer_nmt .* does not know: \['_partial_'\]"),
    ("nested _target_",
     lambda v, c: {**data_options(c), "test": {"_target_": "builtins.open", "_args_": [str(v), "w"]}},
     r"data_config.test is \{'_target_': 'builtins.open'.*, not a str \| None"),
    ("_target_ in a list", lambda v, c: {**data_options(c), "columns": [{"_target_": "builtins.open"}, "de"]},
     r"data_config.columns is \[\{'_target_'"),
]


def crafted_checkpoint(path, tokenizer, data_config):
    write_checkpoint(path, tokenizer)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint[CKPT_DATA_CONFIG] = data_config
    atomic_torch_save(checkpoint, path)
    return path


@pytest.mark.parametrize("name, data_config, refusal", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_a_checkpoint_naming_code_is_refused_by_evaluate_and_never_run(tmp_path, tokenizer, corpus, victim,
                                                                        nothing_is_instantiated, name, data_config,
                                                                        refusal):
    ckpt = crafted_checkpoint(tmp_path / "shared.ckpt", tokenizer, data_config(victim, corpus))
    with pytest.raises(SystemExit, match=rf"checkpoint {ckpt}: {refusal}"):
        evaluate_main([f"ckpt={ckpt}", "split=test", f"out={tmp_path / 'eval'}", "beam=1"])
    if name == "builtins.open":  # translate never reads the data config: one variant shows it
        (tmp_path / "in.txt").write_text("A dog runs.\n")
        translate_main([f"ckpt={ckpt}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}", "beam=1",
                        "max_len_offset=5"])
        assert len((tmp_path / "out.txt").read_text().splitlines()) == 1
    assert victim.read_text() == KEPT and not victim.with_name("new").exists()
    assert {p.name for p in tmp_path.iterdir()} - {"in.txt", "out.txt"} == {"shared.ckpt", "victim.txt"}


def test_a_checkpoints_own_data_config_still_scores_its_test_split(tmp_path, tokenizer, corpus,
                                                                 nothing_is_instantiated):
    ckpt = crafted_checkpoint(tmp_path / "model.ckpt", tokenizer, data_options(corpus))
    result = evaluate_main([f"ckpt={ckpt}", "split=test", f"out={tmp_path / 'eval'}", "beam=1", "max_len_offset=5",
                            "trust_data_paths=true"])  # the corpus: a temporary directory (test_recorded_paths.py)
    assert result["sentences"] == 3


@pytest.fixture(scope="module")
def export(tokenizer, tmp_path_factory):
    pytest.importorskip("ctranslate2")
    from transformer_nmt.inference.export import export_model

    ckpt = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    write_checkpoint(ckpt, tokenizer)
    model, _, meta = load_checkpoint(ckpt)
    return export_model(model, tokenizer, tmp_path_factory.mktemp("ct2") / "model", meta=meta)


def edit_info(model_dir, **changes):
    info_path = model_dir / "transformer_nmt.json"
    info = json.loads(info_path.read_text())
    original = info_path.read_text()
    info.update(changes)
    info_path.write_text(json.dumps(info))
    return lambda: info_path.write_text(original)


@pytest.mark.parametrize("name, data_config, refusal", CRAFTED[:1] + CRAFTED[4:5], ids=["builtins.open", "nested"])
def test_an_export_naming_code_is_refused_by_evaluate_and_never_run(tmp_path, export, corpus, victim,
                                                                     nothing_is_instantiated, name, data_config,
                                                                     refusal):
    restore = edit_info(export, data_config=data_config(victim, corpus))
    try:
        with pytest.raises(SystemExit, match=rf"export {export / 'transformer_nmt.json'}: {refusal}"):
            evaluate_main([f"model_dir={export}", "engine=ctranslate2", "split=test", f"out={tmp_path}", "beam=1"])
        (tmp_path / "in.txt").write_text("A dog runs.\n")
        translate_main([f"model_dir={export}", "engine=ctranslate2", f"input={tmp_path / 'in.txt'}",
                        f"output={tmp_path / 'out.txt'}", "beam=1", "max_len_offset=5"])
    finally:
        restore()
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 1
    assert victim.read_text() == KEPT


# --- configs of a newer version, values of another type --------------------------------------------------------

def test_a_newer_versions_model_field_is_named_with_the_version(tmp_path, tokenizer):
    ckpt = tmp_path / "newer.ckpt"
    write_checkpoint(ckpt, tokenizer)
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint[CKPT_MODEL_CONFIG]["rope_base"] = 10000
    checkpoint[CKPT_VERSION] = "9.1.0"
    atomic_torch_save(checkpoint, ckpt)
    with pytest.raises(CheckpointError, match=rf"checkpoint {ckpt}: transformer_config has fields this "
                                              rf"transformer_nmt \(0\.1\.0\) does not know: \['rope_base'\] \(written "
                                              rf"by transformer_nmt 9\.1\.0\)"):
        load_checkpoint(ckpt)


def test_a_newer_versions_model_field_in_an_export_is_named_with_the_version(export):
    info = json.loads((export / "transformer_nmt.json").read_text())
    restore = edit_info(export, model_config={**info["model_config"], "rope_base": 10000}, version="9.1.0")
    try:
        with pytest.raises(SystemExit, match=r"transformer_nmt.json: model_config has fields .*\['rope_base'\] "
                                             r"\(written by transformer_nmt 9\.1\.0\)"):
            translate_main([f"model_dir={export}", "engine=ctranslate2"])
    finally:
        restore()


def test_a_newer_versions_data_option_is_named_with_the_version(corpus):
    meta = {"path": "newer.ckpt", "data_config": {**data_options(corpus), "bucket_by": "chars"}, "version": "9.1.0"}
    from transformer_nmt.inference.evaluate import split_pairs

    with pytest.raises(SystemExit, match=r"checkpoint newer.ckpt: data_config has fields .*\['bucket_by'\] "
                                         r"\(written by transformer_nmt 9\.1\.0\)"):
        split_pairs(meta, "test")


# --- Lightning's loads ---------------------------------------------------------------------------------------

class OpensOnLoad:
    """Unpickles as ``open(path, "w")``: what a full unpickler (torch.load(weights_only=False)) would run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_lightnings_loads_are_weights_only_and_run_nothing(tmp_path, tokenizer, corpus, victim):
    evil = tmp_path / "evil.ckpt"
    write_checkpoint(evil, tokenizer)
    checkpoint = torch.load(evil, weights_only=True)
    checkpoint["callbacks"] = {"Timer": OpensOnLoad(victim)}
    torch.save(checkpoint, evil)
    control = tmp_path / "control.txt"
    control.write_text(KEPT)
    torch.save({**checkpoint, "callbacks": {"Timer": OpensOnLoad(control)}}, tmp_path / "control.ckpt")
    torch.load(tmp_path / "control.ckpt", weights_only=False)  # what Lightning's weights_only=None may do
    assert control.read_text() == ""  # the crafted file does truncate whatever it names when fully unpickled

    trainer = build_trainer(tiny_config(corpus), tmp_path / "run", callbacks=[])
    for load in (AtomicCheckpointIO().load_checkpoint, trainer.strategy.load_checkpoint):  # what fit/test call
        with pytest.raises(CheckpointError, match=rf"checkpoint {evil} cannot be read by "
                                                  r"torch.load\(weights_only=True\)"):
            load(evil, weights_only=False)
    assert victim.read_text() == KEPT
    good = tmp_path / "good.ckpt"
    write_checkpoint(good, tokenizer)
    assert trainer.strategy.load_checkpoint(good)["global_step"] == read_checkpoint(good)["global_step"] == 10


# --- temporary names, permissions, fsync ---------------------------------------------------------------------

def test_temporary_names_belong_to_their_writer_and_files_get_the_umasks_permissions(tmp_path, tokenizer):
    path = tmp_path / "last.ckpt"
    neighbour = tmp_path / f"last.ckpt.tmp-{os.getpid()}"  # another host's write in progress, with our pid
    neighbour.write_bytes(b"another host's checkpoint, half written")
    write_checkpoint(path, tokenizer)
    assert neighbour.read_bytes() == b"another host's checkpoint, half written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", neighbour.name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask()


def fsync_log(monkeypatch):
    """Record every fsync (by the path of its file descriptor) and every rename, in order."""
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), replace(a, b))[1])
    return events


def assert_published_durably(events, tmp, final: Path, names):
    """Every file ``names`` under ``tmp`` and ``tmp`` itself were fsynced before ``tmp`` was renamed to ``final``,
    and ``final``'s parent after."""
    rename = events.index(("replace", str(tmp), str(final)))
    synced = {path for kind, path, *_ in events[:rename] if kind == "fsync"}
    assert {str(tmp / name) for name in names} | {str(tmp)} <= synced
    assert ("fsync", str(final.parent)) in events[rename + 1:]


def test_a_cache_entry_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    events = fsync_log(monkeypatch)
    built = []

    def build(tmp):
        built.append(tmp)
        (tmp / "pairs.arrow").write_bytes(b"x" * 1000)
        (tmp / "meta.json").write_text("{}")

    assert cached_dir(tmp_path / "raw-train-key", build)
    assert_published_durably(events, built[0], tmp_path / "raw-train-key", ["pairs.arrow", "meta.json"])


@pytest.fixture(scope="module")
def ct2():
    return pytest.importorskip("ctranslate2")


def test_an_export_is_its_writers_alone_and_fsynced_before_its_rename(tmp_path, tokenizer, monkeypatch, ct2):
    from transformer_nmt.inference.export import EXPORT_INFO, export_model

    write_checkpoint(tmp_path / "model.ckpt", tokenizer)
    model, _, meta = load_checkpoint(tmp_path / "model.ckpt")
    neighbour = tmp_path / f"ct2.tmp-{os.getpid()}"  # another host's export in progress, with our pid
    neighbour.mkdir()
    (neighbour / "model.bin").write_bytes(b"theirs")
    events = fsync_log(monkeypatch)
    output = export_model(model, tokenizer, tmp_path / "ct2", meta=meta)
    assert (neighbour / "model.bin").read_bytes() == b"theirs"
    (tmp,) = {Path(a) for kind, a, *b in events if kind == "replace" and b == [str(output)]}
    assert tmp.name.startswith("ct2.tmp-") and tmp != neighbour
    names = sorted(p.name for p in output.iterdir())
    assert {"model.bin", "config.json", "sentencepiece.model", EXPORT_INFO} <= set(names)
    assert_published_durably(events, tmp, output, names)
    listed = json.loads((output / EXPORT_INFO).read_text())["files"]
    assert listed == {name: (output / name).stat().st_size for name in names if name != EXPORT_INFO}


def test_a_truncated_model_bin_is_refused_and_the_cache_exports_it_again(tmp_path, tokenizer, monkeypatch, ct2):
    from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
    from transformer_nmt.inference.export import cached_export

    ckpt = tmp_path / "model.ckpt"
    write_checkpoint(ckpt, tokenizer)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    entry = cached_export(ckpt)
    size = (entry / "model.bin").stat().st_size
    with open(entry / "model.bin", "r+b") as f:  # what a crash before the data reached the disk leaves
        f.truncate(size // 2)
    with pytest.raises(SystemExit, match=rf"model_dir={entry} is not a complete export \(model.bin has {size // 2} "
                                         rf"bytes, transformer_nmt.json records {size}\)"):
        CTranslate2Model(entry)
    assert cached_export(ckpt) == entry and (entry / "model.bin").stat().st_size == size
    assert CTranslate2Model(entry, threads=1).translate_ids([[5, 6, 7, 3]], beam=1)
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name, f"{entry.name}.lock"]
