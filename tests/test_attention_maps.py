"""Per-head attention maps in TensorBoard: one image and one entropy scalar per (kind, layer, head)."""

import math

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from test_train_app import one_thread, tiny_config, write_tiny_corpus  # noqa: F401 (fixture)
from transformer_nmt.callbacks import AttentionMaps, attention_entropy, render_heatmaps
from transformer_nmt.datamodule import TranslationDataModule
from transformer_nmt.model import Transformer, TransformerConfig
from transformer_nmt.train import train

N_ENC, N_DEC, HEADS = 2, 1, 4


def read_events(log_dir):
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def tokenizer(corpus):
    datamodule = TranslationDataModule(train=f"{corpus}/train", val=f"{corpus}/val", test=None,
                                       cache_dir=f"{corpus}/cache", vocab_size=256, num_proc=1)
    datamodule.setup("fit")
    return datamodule.tokenizer


def test_entropy_of_uniform_and_one_hot_attention():
    uniform = torch.full((1, 2, 3, 8), 1 / 8)
    assert torch.allclose(attention_entropy(uniform), torch.full((2,), math.log(8)))
    one_hot = torch.zeros(1, 2, 3, 8)
    one_hot[..., 0] = 1.0
    assert torch.allclose(attention_entropy(one_hot), torch.zeros(2))


def test_heatmap_size_does_not_depend_on_sentence_length():
    short = render_heatmaps([(np.eye(3), list("abc"), list("abc"))], "t", panel_inches=2.0, dpi=50)
    long = render_heatmaps([(np.ones((20, 30)) / 30, ["▁tok"] * 30, ["▁tok"] * 20)] * 2, "t", 2.0, 50)
    assert short.dtype == np.uint8 and short.shape == (3, 100, 100)
    assert long.shape == (3, 100, 200)


def test_one_image_and_one_entropy_per_kind_layer_and_head(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=HEADS,
                                          n_encoder_layers=N_ENC, n_decoder_layers=N_DEC, d_ff=64)).eval()
    probes = [["A man in an orange hat.", "Ein Mann mit einem orangefarbenen Hut."], "Two dogs play."]
    writer = SummaryWriter(str(tmp_path))
    AttentionMaps(probes=probes, panel_inches=3.0, dpi=40).log_maps(writer, model, tokenizer, probes, step=7)
    writer.close()

    events = read_events(tmp_path)
    images = events.Tags()["images"]
    assert len(images) == N_ENC * HEADS + 2 * N_DEC * HEADS  # encoder-self, decoder-self, cross
    assert "attention/cross/layer_0/head_3" in images and "attention/encoder-self/layer_1/head_0" in images
    assert "attention/decoder-self/layer_0/head_2" in images
    for tag in images:
        (image,) = events.Images(tag)
        assert (image.step, image.height, image.width) == (7, 120, 240)  # 3 in x 40 dpi, one panel per probe
    entropies = [t for t in events.Tags()["scalars"] if t.startswith("attention_entropy/")]
    assert sorted(entropies) == sorted(t.replace("attention/", "attention_entropy/") for t in images)
    source_tokens = len(tokenizer.encode(probes[0][0])) + 1
    for tag in entropies:
        (value,) = events.Scalars(tag)
        assert 0.0 <= value.value <= math.log(max(source_tokens, 40))


def test_maps_are_logged_every_nth_validation_of_a_training_run(corpus, tmp_path):
    cfg = tiny_config(corpus, "trainer.max_steps=6", "trainer.val_check_interval=2",
                      "attention_maps.every_n_validations=2", "attention_maps.n_probes=1")
    train(cfg, tmp_path)  # validations at steps 2, 4, 6: maps at the 1st and 3rd
    events = read_events(tmp_path / "tensorboard")
    images = [t for t in events.Tags()["images"] if t.startswith("attention/")]
    model = cfg.model
    assert len(images) == model.n_heads * (model.n_encoder_layers + 2 * model.n_decoder_layers)
    assert [image.step for image in events.Images(images[0])] == [2, 6]
