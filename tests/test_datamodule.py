"""The data module end to end: caches and their reuse, batches, references, DDP ranks, resume, configs, prepare."""

import gzip
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import transformer_nmt.data.datamodule as datamodule_module
from transformer_nmt.data.batching import pair_widths
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT / "data" / "multi30k"


@pytest.fixture(scope="module")
def data_slice(tmp_path_factory):
    """The first pairs of each Multi30k split, as plain and gzipped text under a temporary directory."""
    folder = tmp_path_factory.mktemp("multi30k_slice")
    for split, n in (("train", 1500), ("val", 150), ("test_2016_flickr", 120)):
        for lang in ("en", "de"):
            with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            target = folder / f"{split}.{lang}"
            target.write_text("".join(lines), encoding="utf-8")
    return folder


def make(data_slice, cache, **overrides):
    kwargs = dict(train=str(data_slice / "train"), val=str(data_slice / "val"),
                  test=str(data_slice / "test_2016_flickr"), cache_dir=str(cache), vocab_size=250,
                  max_tokens=600, num_proc=1)
    kwargs.update(overrides)
    return TranslationDataModule(DataConfig(**kwargs))


@pytest.fixture(scope="module")
def data_ready(data_slice, tmp_path_factory):
    dm = make(data_slice, tmp_path_factory.mktemp("cache"))
    dm.setup("fit")
    return dm


def test_batches_follow_the_interface(data_ready):
    batch = next(iter(data_ready.train_dataloader()))
    src, tgt, index = batch["src"], batch["tgt"], batch["index"]
    assert src.dtype == tgt.dtype == index.dtype == torch.long
    assert src.shape[0] == tgt.shape[0] == index.shape[0]
    assert (tgt[:, 0] == 2).all()
    for row in range(src.shape[0]):  # exactly one eos, then only padding
        for seq in (src[row], tgt[row]):
            eos = (seq == 3).nonzero().flatten()
            assert len(eos) == 1 and (seq[eos[0] + 1:] == 0).all() and (seq[: eos[0]] != 0).all()


def test_no_batch_exceeds_max_tokens_and_each_pair_once(data_ready):
    for split in ("train", "val", "test"):
        seen = []
        for batch in data_ready.dataloader(split):
            assert batch["src"].numel() <= 600 and batch["tgt"].numel() <= 600
            seen += batch["index"].tolist()
        assert sorted(seen) == list(range(data_ready.splits[split].report.kept)), split


def test_references_align_with_index(data_ready):
    refs, srcs = data_ready.references("val"), data_ready.sources("val")
    assert len(refs) == len(srcs) == data_ready.splits["val"].report.kept
    tok = data_ready.tokenizer
    exact = total = 0
    for batch in data_ready.val_dataloader():
        for tgt, src, i in zip(batch["tgt"], batch["src"], batch["index"]):
            exact += tok.decode(tgt.tolist()) == refs[i]
            exact += tok.decode(src.tolist()) == srcs[i]
            total += 2
    assert exact / total > 0.95  # all but text that SentencePiece normalizes (e.g. unusual spaces)


def test_second_setup_reuses_vocabulary_and_tokenizes_nothing(data_ready, data_slice, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("cache not reused")

    monkeypatch.setattr(datamodule_module, "train_sentencepiece", forbidden)
    monkeypatch.setattr(datamodule_module, "tokenize_dataset", forbidden)
    monkeypatch.setattr(Tokenizer, "encode_batch", forbidden)
    monkeypatch.setattr(datamodule_module, "write_split", forbidden)
    again = make(data_slice, data_ready.cache_dir)
    again.setup("fit")
    assert not again.tokenizer_trained_now
    assert not any(s.tokenized_now for s in again.splits.values())
    assert again.tokenizer.model_proto == data_ready.tokenizer.model_proto
    same_seed = [b["index"].tolist() for b in again.train_dataloader()]
    assert same_seed == [b["index"].tolist() for b in data_ready.train_dataloader()]  # fresh loaders: epoch 0


def test_direction_switch_reuses_caches(data_ready, data_slice, monkeypatch):
    monkeypatch.setattr(datamodule_module, "tokenize_dataset", lambda *a, **k: pytest.fail("re-tokenized"))
    reverse = make(data_slice, data_ready.cache_dir, src_lang="de", tgt_lang="en")
    reverse.setup()
    assert reverse.references("val") == data_ready.sources("val")
    assert reverse.sources("test") == data_ready.references("test")


def test_changing_vocabulary_options_retrains(data_ready, data_slice):
    other = make(data_slice, data_ready.cache_dir, vocab_size=200, spm_model_type="unigram")
    other.setup()
    assert other.tokenizer_trained_now and all(s.tokenized_now for s in other.splits.values())


def test_two_ranks_get_disjoint_batches_covering_the_epoch(data_ready):
    per_rank = []
    for rank in range(2):
        data_ready.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        try:
            per_rank.append([b["index"].tolist() for b in data_ready.train_dataloader()])
        finally:
            data_ready.trainer = None
    assert len(per_rank[0]) == len(per_rank[1])
    flat = [i for batches in per_rank for b in batches for i in b]
    assert sorted(flat) == list(range(data_ready.splits["train"].report.kept))


def test_loader_state_resumes_mid_epoch(data_ready):
    reference = data_ready.train_dataloader()
    reference.batch_sampler.set_epoch(1)
    full = [b["index"].tolist() for b in reference]
    loader = data_ready.train_dataloader()
    loader.batch_sampler.set_epoch(1)
    it = iter(loader)
    first = [next(it)["index"].tolist() for _ in range(3)]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["batches_yielded"] == 3
    resumed = data_ready.train_dataloader()
    resumed.load_state_dict(state)
    resumed.batch_sampler.set_epoch(1)
    rest = [b["index"].tolist() for b in resumed]
    assert first + rest == full
    assert resumed.state_dict()["epoch"] == 2


class _RecordingModule:
    """A LightningModule with one parameter that records the first pair index of every training batch."""

    @staticmethod
    def make():
        import lightning as L

        class Recording(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(1))
                self.seen = []

            def training_step(self, batch, _):
                self.seen.append(batch["index"][0].item())
                return (self.w - batch["src"].float().mean()) ** 2

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Recording()


def _fit(dm, steps, ckpt_path=None, checkpoint_dir=None):
    import lightning as L

    module = _RecordingModule.make()
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(checkpoint_dir, every_n_train_steps=3, save_top_k=-1)] \
        if checkpoint_dir else []
    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=bool(checkpoint_dir), callbacks=callbacks,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        limit_val_batches=0, accelerator="cpu", devices=1)
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    finally:
        dm.trainer = None
    return module.seen


def test_lightning_resumes_mid_epoch_where_it_stopped(data_ready, tmp_path):
    uninterrupted = _fit(data_ready, 6, checkpoint_dir=tmp_path)  # checkpoints after steps 3 and 6
    step3 = torch.load(tmp_path / "epoch=0-step=3.ckpt", weights_only=False)
    assert step3["loops"]["fit_loop"]["state_dict"]["combined_loader"] == \
        [{"epoch": 0, "batches_yielded": 3, "num_replicas": 1, "dealt_before": [], "seed": data_ready.seed,
          "max_tokens": data_ready.max_tokens,
          "pad_to_multiple": data_ready.pad_to_multiple, "members_drawn": False}]  # what the plan depends on
    resumed = _fit(data_ready, 6, ckpt_path=tmp_path / "epoch=0-step=3.ckpt")
    assert uninterrupted[3:] == resumed


def test_bad_inputs_surface_from_setup(tmp_path, data_slice):
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("a\n")
    dm = make(data_slice, tmp_path / "cache", train=str(tmp_path / "train"))
    with pytest.raises(ValueError, match="line counts differ: .*train.en has 2 lines, .*train.de has 1"):
        dm.setup()
    with pytest.raises(ValueError, match=r"data.val='nowhere/val': no file nowhere/val.en"):
        make(data_slice, tmp_path / "cache", val="nowhere/val").setup()


def test_configs_compose(data_slice):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from transformer_nmt.training.config import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        default = compose("prepare")
        assert default.data.format == "text" and default.data.train == "data/multi30k/train"
        assert OmegaConf.get_type(default.data) is DataConfig and "_target_" not in default.data
        with pytest.raises(Exception, match="Could not override 'data.vocab_sizes'"):  # a typo fails at compose
            compose("prepare", overrides=["data.vocab_sizes=300"])
        with pytest.raises(Exception, match="data.vocab_size"):  # and so does a value of the wrong type
            compose("prepare", overrides=["data.vocab_size=many"])
        wmt = compose("prepare", overrides=["data=wmt14_en_de"])
        assert (wmt.data.format, wmt.data.hub_config, wmt.data.vocab_size) == ("hub", "de-en", 37000)
        local = compose("prepare", overrides=["data=local", f"data.train={data_slice}/train"])
        assert local.data.train == f"{data_slice}/train"
        with pytest.raises(Exception, match="Missing mandatory value"):
            local.data.val


def test_prepare_on_bundled_multi30k(tmp_path):
    cmd = [sys.executable, "-m", "transformer_nmt.prepare", f"data.cache_dir={tmp_path}/cache", "data.vocab_size=300",
           f"hydra.run.dir={tmp_path}/hydra"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    out = first.stdout
    assert "ids: pad=0 unk=1 bos=2 eos=3" in out
    assert "train      29000" in out and "val         1014" in out and "test        1000" in out
    assert "train: filtered 2 of 29000 pairs: 2 length ratio" in out
    assert "tokenized now: train, val, test" in out
    assert "p50" in out and "batches per epoch" in out


def _setup_in_process(args):
    data_slice, cache = args
    dm = make(data_slice, cache)
    dm.setup()
    return dm.tokenizer_trained_now, [s.tokenized_now for s in dm.splits.values()], dm.tokenizer.model_proto


def test_concurrent_setup_builds_each_cache_once(data_slice, tmp_path):
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:  # like two DDP ranks on one node
        results = pool.map(_setup_in_process, [(data_slice, tmp_path / "cache")] * 2)
    assert sorted(r[0] for r in results) == [False, True]  # one trained the vocabulary, the other reused it
    assert [a or b for a, b in zip(results[0][1], results[1][1])] == [True, True, True]
    assert not any(a and b for a, b in zip(results[0][1], results[1][1]))  # each split tokenized once
    assert results[0][2] == results[1][2]
    assert not list((tmp_path / "cache").glob("*.tmp-*"))  # no half-written directories left


def test_worker_processes_produce_the_same_batches(data_ready):
    data_ready.num_workers = 1
    try:
        with_workers = [b["index"].tolist() for b in data_ready.val_dataloader()]
    finally:
        data_ready.num_workers = 0
    assert with_workers == [b["index"].tolist() for b in data_ready.val_dataloader()]


def test_given_tokenizer_path_is_used_instead_of_training(data_ready, data_slice, tmp_path, monkeypatch):
    data_ready.tokenizer.save(tmp_path / "given.model")
    monkeypatch.setattr(datamodule_module, "train_sentencepiece", lambda *a, **k: pytest.fail("trained"))
    dm = make(data_slice, data_ready.cache_dir, tokenizer_path=str(tmp_path / "given.model"))
    dm.setup()
    assert dm.tokenizer.model_proto == data_ready.tokenizer.model_proto
    assert not any(s.tokenized_now for s in dm.splits.values())  # same model bytes: same token cache


@pytest.mark.parametrize("content", [b"not a model at all", None])
def test_a_tokenizer_path_that_is_not_a_sentencepiece_model_names_option_and_file(data_slice, tmp_path, content):
    path = tmp_path / "spm.model"
    if content is not None:
        path.write_bytes(content)
    problem = "is not a usable SentencePiece model" if content is not None else "no such file"
    with pytest.raises(ValueError, match=rf"data.tokenizer_path={path}: (.*spm.model )?{problem}"):
        make(data_slice, tmp_path / "cache", tokenizer_path=str(path)).setup()


def test_every_data_option_has_one_default_in_data_config(data_slice):
    """DataConfig holds every option's default and help; conf/data/local.yaml extends it without repeating one,
    the other data configs are diffs over local.yaml, and the datamodule takes a DataConfig."""
    import dataclasses
    import inspect

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from transformer_nmt.training.config import register_configs

    options = {f.name: f for f in dataclasses.fields(DataConfig)}
    assert all(f.metadata["help"] for f in options.values())
    assert [name for name in options if OmegaConf.is_missing(OmegaConf.structured(DataConfig), name)] == [
        "train", "val", "test"]
    local = OmegaConf.load(ROOT / "conf" / "data" / "local.yaml")
    assert set(local) == {"defaults"} and list(local.defaults) == ["schema", "_self_"]
    assert list(inspect.signature(TranslationDataModule).parameters) == ["config", "seed", "pad_to_multiple",
                                                                          "tokenizer"]
    for data_config in ("multi30k", "wmt14_en_de"):
        text = (ROOT / "conf" / "data" / f"{data_config}.yaml").read_text()
        assert "defaults:\n  - local\n" in text and "_target_" not in text and "num_proc" not in text
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        multi30k = compose("prepare").data
    assert set(multi30k) == set(options) and multi30k.num_proc == DataConfig.num_proc == 2
    for name in set(options) - {"train", "val", "test"}:  # multi30k.yaml changes the locations only
        assert multi30k[name] == getattr(DataConfig(train="t", val="v", test=None), name), name
    dm = TranslationDataModule(multi30k, seed=5, pad_to_multiple=8)  # the app's node, and its run-time values
    assert (dm.seed, dm.pad_to_multiple, dm.config.num_proc) == (5, 8, 2)
    assert dm.spec == DataConfig(**OmegaConf.to_container(multi30k)).corpus_spec()


def test_cleaned_lines_are_counted_in_the_report_and_filters_are_memory_mapped(data_slice, tmp_path):
    lines = (data_slice / "train.de").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3] = lines[3].replace(" ", "\x1b", 1)
    (tmp_path / "train.de").write_text("".join(lines), encoding="utf-8")
    (tmp_path / "train.en").write_text((data_slice / "train.en").read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"train.de:4: U\+001B \(ESC\)"):
        make(data_slice, tmp_path / "cache", train=str(tmp_path / "train")).setup()
    dm = make(data_slice, tmp_path / "cache", train=str(tmp_path / "train"), control_chars="replace")
    dm.setup()
    assert dm.splits["train"].report.control_replaced_sentences == 1
    assert "1 sentences with control characters replaced by spaces" in str(dm.splits["train"].report)
    again = make(data_slice, tmp_path / "cache", train=str(tmp_path / "train"), control_chars="replace")
    again.setup()
    assert str(again.splits["train"].report) == str(dm.splits["train"].report)  # from the cache, count and all
    s = again.splits["train"]
    assert isinstance(s.keep, np.memmap) and isinstance(s.widths, np.memmap)  # shared by the ranks of a node
    assert s.widths.tolist() == pair_widths(s.lengths("en"), s.lengths("de")).tolist()


def test_loader_state_resumes_on_another_number_of_ranks(data_ready):
    """Two ranks consume 2 batches each and checkpoint (rank 0's state); one process finishes the epoch."""
    consumed = []
    for rank in range(2):
        data_ready.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        try:
            loader = data_ready.train_dataloader()
            it = iter(loader)
            consumed += [next(it)["index"].tolist() for _ in range(2)]
            if rank == 0:
                state = loader.state_dict()
        finally:
            data_ready.trainer = None
    assert (state["num_replicas"], state["batches_yielded"]) == (2, 2)
    resumed = data_ready.train_dataloader()
    resumed.load_state_dict(state)
    rest = [b["index"].tolist() for b in resumed]
    seen = sorted(i for b in consumed + rest for i in b)
    assert seen == list(range(data_ready.splits["train"].report.kept))
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["dealt_before"] == []
