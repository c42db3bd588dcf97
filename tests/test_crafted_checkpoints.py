"""Every reader of a checkpoint goes through one guarded loader (checkpoint.read_checkpoint, which runs
check_stored_sizes), and averaging checks each input as loading does (model_config_of): a crafted file cannot make
``average`` allocate what the file does not hold. Models that translate in other directions are never one ensemble or
one average (checkpoint.translation_languages)."""

import math

import pytest
import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import (
    CKPT_DATA_CONFIG,
    CKPT_MODEL_CONFIG,
    MODEL_PREFIX,
    CheckpointError,
    atomic_torch_save,
    read_checkpoint,
)
from transformer_nmt.inference.average import average_checkpoints
from transformer_nmt.inference.average import main as average_main
from transformer_nmt.inference.ensemble import load_ensemble
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.records import from_record


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(vocab_size=100)


def crafted(path, tokenizer, **model_config):
    """A checkpoint whose model config is ``model_config`` and whose every weight has that config's shape but is a
    stride-0 view of one stored value: a few hundred KB on disk, ``sum(numel)`` weights by the shapes."""
    write_checkpoint(path, tokenizer)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint[CKPT_MODEL_CONFIG].update(model_config)
    config = from_record(TransformerConfig, checkpoint[CKPT_MODEL_CONFIG], "test", CKPT_MODEL_CONFIG)
    with torch.device("meta"):
        shapes = {key: value.shape for key, value in Transformer(config).state_dict().items()}
    checkpoint["state_dict"] = {MODEL_PREFIX + key: torch.zeros(1).expand(shape) for key, shape in shapes.items()}
    atomic_torch_save(checkpoint, path)
    return sum(math.prod(shape) for shape in shapes.values())


def test_average_of_a_crafted_file_is_refused_before_anything_is_summed(tmp_path, tokenizer):
    """The issue's input: stride-0 weights (here ~3.5M described, ~28 MB as float64 per copy) in a file of a few
    hundred KB; averaging it refuses, naming the file and the weight, and writes nothing."""
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    described = crafted(a, tokenizer, d_model=512, d_ff=2048, n_heads=8)
    crafted(b, tokenizer, d_model=512, d_ff=2048, n_heads=8)
    assert a.stat().st_size < 10 ** 6 and described > 3 * 10 ** 6
    with pytest.raises(CheckpointError, match=rf"checkpoint {a}: state_dict/model\.\S+ has shape \(.*\) \([\d,]+ "
                                              r"values\) but its storage holds 1 \(a view that repeats"):
        average_checkpoints([a, b], allow_mixed=True)
    with pytest.raises(SystemExit, match="a view that repeats stored values"):
        average_main([f"inputs=[{a},{b}]", f"output={tmp_path / 'avg.ckpt'}", "allow_mixed=true"])
    assert not (tmp_path / "avg.ckpt").exists()


def test_average_applies_the_model_limits(tmp_path, tokenizer):
    """A model config above MODEL_LIMITS, whose real weights are small: load_checkpoint refuses it, and so does
    average now (it read the weights alone before)."""
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    for path in (a, b):
        write_checkpoint(path, tokenizer, run="one-run")
        checkpoint = torch.load(path, weights_only=True)
        checkpoint[CKPT_MODEL_CONFIG]["d_ff"] = 2 ** 19
        atomic_torch_save(checkpoint, path)
    with pytest.raises(CheckpointError, match=rf"checkpoint {a}: transformer_config\.d_ff=524288 is above"):
        average_checkpoints([a, b])


def test_many_views_of_one_storage_are_refused(tmp_path, tokenizer):
    """The variant the per-tensor check lets through: each tensor no larger than its storage, but hundreds of them
    viewing the same one (each copy would allocate it again)."""
    path = tmp_path / "views.ckpt"
    write_checkpoint(path, tokenizer)
    checkpoint = torch.load(path, weights_only=True)
    shared = torch.zeros(10_000)
    checkpoint["optimizer_states"] = [{"state": {i: {"exp_avg": shared} for i in range(50)}}]
    atomic_torch_save(checkpoint, path)
    with pytest.raises(CheckpointError, match=rf"checkpoint {path}: its tensors describe [\d,]+ values but the file "
                                              r"stores [\d,]+ \(more than \d+ views"):
        read_checkpoint(path, mmap=True)


def test_a_repeating_view_in_the_training_state_is_refused_for_resume_too(tmp_path, tokenizer):
    """Not only the weights: Adam's state (read by Lightning's resume through the same loader) may not repeat
    stored values either."""
    path = tmp_path / "adam.ckpt"
    write_checkpoint(path, tokenizer)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["optimizer_states"] = [{"state": {0: {"exp_avg": torch.zeros(1, dtype=torch.float64).expand(10 ** 7)}}}]
    atomic_torch_save(checkpoint, path)
    with pytest.raises(CheckpointError, match=r"optimizer_states\[0\]/state/0/exp_avg has shape \(10000000,\)"):
        read_checkpoint(path, training_state=True)


def test_tied_weights_and_real_checkpoints_pass(tmp_path, tokenizer):
    path = tmp_path / "ok.ckpt"
    write_checkpoint(path, tokenizer)
    assert read_checkpoint(path)["global_step"] == 10


# --- directions -----------------------------------------------------------------------------------------------------

def with_languages(path, src, tgt):
    checkpoint = torch.load(path, weights_only=True)
    checkpoint[CKPT_DATA_CONFIG] = {"src_lang": src, "tgt_lang": tgt, "train": "data/x/train", "val": "data/x/val",
                                    "test": None}
    atomic_torch_save(checkpoint, path)
    return path


@pytest.fixture
def two_directions(tmp_path, tokenizer):
    """An en->de and a de->en model of one vocabulary (what the reverse fine-tuning study makes)."""
    forward, backward = tmp_path / "en-de.ckpt", tmp_path / "de-en.ckpt"
    write_checkpoint(forward, tokenizer, seed=0, run="same-run")
    write_checkpoint(backward, tokenizer, seed=1, run="same-run")
    return with_languages(forward, "en", "de"), with_languages(backward, "de", "en")


def test_an_ensemble_of_two_directions_is_refused(two_directions):
    forward, backward = two_directions
    with pytest.raises(SystemExit, match=rf"ensemble: checkpoint {backward} translates data.src_lang='de' "
                                         rf"data.tgt_lang='en', {forward} data.src_lang='en' data.tgt_lang='de'"):
        load_ensemble([str(forward), str(backward)])
    model, _, meta = load_ensemble([str(forward), str(forward)])  # one direction: an ensemble
    assert meta["path"] == [str(forward)] * 2


def test_an_ensemble_of_a_model_without_languages_beside_one_with_is_refused(tmp_path, tokenizer, two_directions):
    forward, _ = two_directions
    unknown = tmp_path / "unknown.ckpt"
    write_checkpoint(unknown, tokenizer)
    with pytest.raises(SystemExit, match=r"translates no data config \(its languages unknown\)"):
        load_ensemble([str(forward), str(unknown)])


def test_an_average_of_two_directions_is_refused_even_with_allow_mixed(two_directions):
    forward, backward = two_directions
    for allow_mixed in (False, True):
        with pytest.raises(CheckpointError, match=r"2 different translation directions \(data.src_lang='en' "
                                                  r"data.tgt_lang='de' / data.src_lang='de' data.tgt_lang='en'\).*"
                                                  r"allow_mixed=true does not apply"):
            average_checkpoints([forward, backward], allow_mixed=allow_mixed)
