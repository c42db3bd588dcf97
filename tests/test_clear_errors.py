"""Crashes that now say what is wrong: references that are all blank, a truncated .gz, an init_from checkpoint of a
newer version, and a checkpoint whose model config asks for absurd sizes (refused before anything is allocated)."""

import gzip
import math

import pytest
import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint
from tiny_corpus import tiny_config, write_tiny_corpus

import transformer_nmt.checkpoint as checkpoint_module
from transformer_nmt.checkpoint import (
    CKPT_MODEL_CONFIG,
    CKPT_VERSION,
    MODEL_PREFIX,
    CheckpointError,
    atomic_torch_save,
    load_checkpoint,
)
from transformer_nmt.data.corpus import CorpusError, CorpusSpec, ReadStats, read_pairs
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.inference.evaluate import score
from transformer_nmt.inference.translate import read_lines
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.records import from_record
from transformer_nmt.training.app import ConfigError, train


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(vocab_size=100)


@pytest.fixture
def ckpt(tmp_path, tokenizer):
    path = tmp_path / "model.ckpt"
    write_checkpoint(path, tokenizer)
    return path


def edited(path, **model_config):
    checkpoint = torch.load(path, weights_only=True)
    checkpoint[CKPT_MODEL_CONFIG].update(model_config)
    atomic_torch_save(checkpoint, path)
    return path


# --- all-blank references ------------------------------------------------------------------------------------------

def test_all_blank_references_are_an_error_naming_them(tmp_path, ckpt):
    (tmp_path / "src.en").write_text("A dog runs.\nA cat.\n")
    (tmp_path / "ref.de").write_text("\n   \n")
    with pytest.raises(ValueError, match="every reference line is blank"):
        score(["Ein Hund.", "Eine Katze."], ["", "   "])
    with pytest.raises(SystemExit, match=rf"ref={tmp_path / 'ref.de'}: every reference line is blank"):
        evaluate_main([f"ckpt={ckpt}", f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}", "beam=1",
                       "max_len_offset=3", f"out={tmp_path / 'eval'}"])
    assert not (tmp_path / "eval").exists()


# --- a truncated .gz -----------------------------------------------------------------------------------------------

def truncated_gzip(path, lines: int = 2000):
    data = gzip.compress("".join(f"Sentence number {i} of the corpus.\n" for i in range(lines)).encode())
    path.write_bytes(data[: len(data) // 2])
    return path


def test_translate_names_a_truncated_gz_input(tmp_path):
    path = truncated_gzip(tmp_path / "in.en.gz")
    with pytest.raises(SystemExit, match=rf"{path}: .*gzip.*truncated or corrupt"):
        read_lines(path)


@pytest.mark.parametrize("fmt", ["text", "tsv", "jsonl"])
def test_reading_a_corpus_names_a_truncated_gz_and_the_line(tmp_path, fmt):
    if fmt == "text":
        truncated_gzip(tmp_path / "test.en.gz")
        (tmp_path / "test.de").write_text("".join(f"Satz {i}.\n" for i in range(2000)))
        location, broken = str(tmp_path / "test"), tmp_path / "test.en.gz"
    else:
        rows = (f"Sentence {i}.\tSatz {i}.\n" if fmt == "tsv" else f'{{"en": "Sentence {i}.", "de": "Satz {i}."}}\n'
                for i in range(2000))
        data = gzip.compress("".join(rows).encode())
        broken = location = tmp_path / f"test.{fmt}.gz"
        broken.write_bytes(data[: len(data) // 2])
    spec = CorpusSpec(fmt, ("en", "de"), {"test": str(location)})
    with pytest.raises(CorpusError, match=rf"{broken}: the gzip stream breaks off after line \d+ .*truncated or "
                                          r"corrupt"):
        list(read_pairs(spec, "test", ReadStats()))


# --- init_from a newer checkpoint, absurd sizes ---------------------------------------------------------------------

def test_init_from_a_checkpoint_with_a_newer_field_names_the_file_field_and_version(tmp_path, ckpt):
    edited(ckpt, rope_base=10000)
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint[CKPT_VERSION] = "9.1.0"
    atomic_torch_save(checkpoint, ckpt)
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=8, n_eval=2)
    with pytest.raises(ConfigError, match=rf"init_from={ckpt}: transformer_config has fields .*\['rope_base'\] "
                                          r"\(written by transformer_nmt 9\.1\.0\)"):
        train(tiny_config(corpus, f"init_from={ckpt}", "data.max_positions=64",
                               "trainer.max_steps=1"), tmp_path / "run")


@pytest.fixture
def never_allocated(monkeypatch):
    """The model is never built but on the meta device, which allocates nothing (the test fails, rather than
    allocating what the config asks for)."""
    real = checkpoint_module.Transformer

    def built(config):
        if torch.empty(0).device.type == "meta":  # inside torch.device("meta"): shapes only
            return real(config)
        raise AssertionError("the model was built from the checkpoint's config")
    monkeypatch.setattr(checkpoint_module, "Transformer", built)


@pytest.mark.parametrize("field, value", [("d_model", 10 ** 9), ("vocab_size", 10 ** 9), ("max_positions", 10 ** 9),
                                          ("d_ff", 10 ** 9), ("n_encoder_layers", 10 ** 6)])
def test_absurd_sizes_are_refused_before_anything_is_allocated(ckpt, never_allocated, field, value):
    edited(ckpt, **{field: value, "n_heads": 1} if field == "d_model" else {field: value})
    with pytest.raises(CheckpointError, match=rf"checkpoint {ckpt}: transformer_config.{field}={value} is above "
                                              r"\d+, the most"):
        load_checkpoint(ckpt)


def test_sizes_the_weights_do_not_have_are_refused_before_anything_is_allocated(ckpt, never_allocated):
    edited(ckpt, d_model=4096, d_ff=16384)  # within the bounds, but the file holds a d_model 16 model
    with pytest.raises(CheckpointError, match=rf"checkpoint {ckpt}: its model config does not describe its weights: "
                                              r"model.src_embed.weight is \(100, 16\) in the file, \(100, 4096\) by "
                                              r"the config"):
        load_checkpoint(ckpt)


def test_more_weights_than_the_file_holds_are_refused_before_anything_is_allocated(ckpt, never_allocated):
    edited(ckpt, n_encoder_layers=512)  # within the bounds; the file holds one layer
    with pytest.raises(CheckpointError, match=rf"checkpoint {ckpt}: its model config describes [\d,]+ weights "
                                              r"\(.*layers 512\+1\) but the file holds [\d,]+"):
        load_checkpoint(ckpt)


def test_weights_that_repeat_one_stored_value_are_refused_before_anything_is_allocated(ckpt, never_allocated):
    """A crafted file within the bounds whose every weight has the config's shape but is a stride-0 view of one
    stored value (``torch.zeros(1).expand(shape)``): the shapes match, so numel would count ~10^10 weights; the file
    stores a few values per tensor, and loading is refused before the model is built (by the read itself now:
    checkpoint.check_stored_sizes, which every reader runs, names the first such weight)."""
    edited(ckpt, d_model=4096, d_ff=2 ** 18, n_heads=16, n_encoder_layers=16, n_decoder_layers=16)
    checkpoint = torch.load(ckpt, weights_only=True)
    config = from_record(TransformerConfig, checkpoint[CKPT_MODEL_CONFIG], "test", CKPT_MODEL_CONFIG)
    with torch.device("meta"):
        shapes = {key: value.shape for key, value in Transformer(config).state_dict().items()}
    checkpoint["state_dict"] = {MODEL_PREFIX + key: torch.zeros(1).expand(shape) for key, shape in shapes.items()}
    atomic_torch_save(checkpoint, ckpt)
    assert ckpt.stat().st_size < 10 ** 6 and sum(math.prod(shape) for shape in shapes.values()) > 10 ** 10
    with pytest.raises(CheckpointError, match=rf"checkpoint {ckpt}: state_dict/model\.\S+ has shape \(.*\) "
                                              r"\([\d,]+ values\) but its storage holds 1 \(a view that repeats"):
        load_checkpoint(ckpt)


def test_a_tied_embedding_counts_once_on_both_sides(ckpt):
    """The tiny checkpoint ties its embeddings (one storage under two names): stored values counted per storage
    still cover what the config needs, and it loads."""
    checkpoint = torch.load(ckpt, weights_only=True)
    weights = checkpoint["state_dict"]
    tied = [key for key in weights if key.endswith("_embed.weight")]
    assert len(tied) == 2 and weights[tied[0]].untyped_storage().data_ptr() == \
        weights[tied[1]].untyped_storage().data_ptr()
    model, _, _ = load_checkpoint(ckpt)
    assert model.src_embed is model.tgt_embed


def test_a_checkpoint_of_the_layout_before_in_proj_still_loads(ckpt):
    """The size checks compare what the file holds, not the names: q_proj/k_proj/v_proj, which read_checkpoint
    stacks into in_proj (checkpoint.migrate_checkpoint), pass."""
    checkpoint = torch.load(ckpt, weights_only=True)
    old = {}
    for key, value in checkpoint["state_dict"].items():
        if ".in_proj." in key:
            for name, part in zip("qkv", value.chunk(3)):
                old[key.replace(".in_proj.", f".{name}_proj.")] = part.clone()
        else:
            old[key] = value
    atomic_torch_save({**checkpoint, "state_dict": old}, ckpt)
    model, _, _ = load_checkpoint(ckpt)
    expected = torch.load(ckpt, weights_only=True)["state_dict"]
    stacked = torch.cat([expected[f"model.encoder_layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(model.encoder_layers[0].self_attn.in_proj.weight, stacked)
