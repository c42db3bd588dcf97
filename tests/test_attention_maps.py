"""Per-head attention maps in TensorBoard: per (kind, layer, head) one image per probe under one tag and one
entropy scalar, rendered off the training thread."""

import logging
import math
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from tensorboard_events import decode, image_samples, read_events
from tiny_corpus import tiny_config, write_tiny_corpus
from torch.utils.tensorboard import SummaryWriter

from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.inference.attention_maps import attention_entropy, render_heatmaps
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.training.app import train
from transformer_nmt.training.callbacks import AttentionMaps

N_ENC, N_DEC, HEADS = 2, 1, 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def tokenizer(corpus):
    datamodule = TranslationDataModule(DataConfig(train=f"{corpus}/train", val=f"{corpus}/val", test=None,
                                                  cache_dir=f"{corpus}/cache", vocab_size=256, num_proc=1))
    datamodule.setup("fit")
    return datamodule.tokenizer


def test_entropy_of_uniform_and_one_hot_attention():
    uniform = torch.full((1, 2, 3, 8), 1 / 8)
    assert torch.allclose(attention_entropy(uniform), torch.full((2,), math.log(8)))
    one_hot = torch.zeros(1, 2, 3, 8)
    one_hot[..., 0] = 1.0
    assert torch.allclose(attention_entropy(one_hot), torch.zeros(2))


def test_one_png_per_map_at_one_size_whatever_the_sentence_length():
    short = render_heatmaps(np.stack([np.eye(3), np.eye(3)[::-1]]), list("abc"), list("abc"), ["t0", "t1"], 2.0, 50)
    long = render_heatmaps(np.ones((1, 20, 30)) / 30, ["▁tok"] * 30, ["▁tok"] * 20, ["t"], inches=2.0, dpi=50)
    assert len(short) == 2 and len(long) == 1
    assert {decode(png).shape for png in short + long} == {(100, 100, 3)}


def test_each_map_is_drawn_with_its_own_weights():
    """Cell centres of eye(3) and of its mirror show viridis at the top (1) and at the bottom (0) of the scale."""
    maps = np.stack([np.eye(3), np.eye(3)[:, ::-1]])
    pixels = [decode(png) for png in render_heatmaps(maps, list("abc"), list("xyz"), ["a", "b"], inches=3.0, dpi=60)]
    size = 180
    def cell(image, row, col):  # the axes span x 0.2..0.99 and y 0.2..0.93 of the figure (render_heatmaps)
        x = (0.2 + (col + 0.5) / 3 * 0.79) * size
        y = (0.07 + (row + 0.5) / 3 * 0.73) * size  # from the top
        return image[int(y), int(x)].astype(int)
    high, low = (np.array(colormaps["viridis"](v)[:3]) * 255 for v in (1.0, 0.0))
    for image, weights in zip(pixels, maps):
        for row in range(3):
            for col in range(3):
                expected = high if weights[row, col] == 1 else low
                assert np.abs(cell(image, row, col) - expected).max() <= 2, (row, col)


def test_one_image_per_probe_and_one_entropy_per_kind_layer_and_head(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=HEADS,
                                          n_encoder_layers=N_ENC, n_decoder_layers=N_DEC, d_ff=64)).eval()
    probes = [["A man in an orange hat.", "Ein Mann mit einem orangefarbenen Hut."], "Two dogs play."]
    writer = SummaryWriter(str(tmp_path))
    maps = AttentionMaps(probes=probes, inches=3.0, dpi=40)
    assert maps.log_maps(writer, model, tokenizer, probes, step=7) == 2 * HEADS * (N_ENC + 2 * N_DEC)
    writer.close()

    events = read_events(tmp_path)
    images = events.Tags()["tensors"]
    assert len(images) == N_ENC * HEADS + 2 * N_DEC * HEADS  # encoder-self, decoder-self, cross
    assert "attention/cross/layer_0/head_3" in images and "attention/encoder-self/layer_1/head_0" in images
    assert "attention/decoder-self/layer_0/head_2" in images
    for tag in images:
        ((step, samples),) = image_samples(events, tag)  # one step, one image per probe, 3 in x 40 dpi
        assert step == 7 and [s.shape for s in samples] == [(120, 120, 3)] * 2
        assert not np.array_equal(samples[0], samples[1])
    entropies = [t for t in events.Tags()["scalars"] if t.startswith("attention_entropy/")]
    assert sorted(entropies) == sorted(t.replace("attention/", "attention_entropy/") for t in images)
    source_tokens = len(tokenizer.encode(probes[0][0])) + 1
    for tag in entropies:
        (value,) = events.Scalars(tag)
        assert 0.0 <= value.value <= math.log(max(source_tokens, 40))


def test_maps_drawn_after_the_logger_closed_its_writer_are_still_written(tmp_path, tokenizer):
    """Lightning's logger closes its writer at the end of fit; a validation after it (validate_at_end) draws maps."""
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=32)).eval()
    writer = SummaryWriter(str(tmp_path))
    writer.close()
    assert AttentionMaps(inches=1.5, dpi=40).log_maps(writer, model, tokenizer, ["Two dogs play."], step=9) == 6
    writer.close()
    events = read_events(tmp_path)
    images = [t for t in events.Tags()["tensors"] if t.startswith("attention/")]
    assert len(images) == 6 and all([step for step, _ in image_samples(events, t)] == [9] for t in images)


def test_maps_are_logged_every_nth_validation_of_a_training_run(corpus, tmp_path, caplog):
    cfg = tiny_config(corpus, "trainer.max_steps=6", "trainer.val_check_interval=2",
                      "attention_maps.every_n_validations=2", "attention_maps.n_probes=1")
    with caplog.at_level(logging.INFO, logger="transformer_nmt.training.callbacks"):
        train(cfg, tmp_path)  # validations at steps 2, 4, 6: maps at the 1st and 3rd
    events = read_events(tmp_path / "tensorboard")
    images = [t for t in events.Tags()["tensors"] if t.startswith("attention/")]
    model = cfg.model
    assert len(images) == model.n_heads * (model.n_encoder_layers + 2 * model.n_decoder_layers)
    assert [(step, len(samples)) for step, samples in image_samples(events, images[0])] == [(2, 1), (6, 1)]
    for cost in ("attention_maps/seconds", "attention_maps/render_seconds"):
        assert [e.step for e in events.Scalars(cost)] == [2, 6] and all(e.value > 0 for e in events.Scalars(cost))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention maps at step")]
    assert len(lines) == 2 and f"rendering {len(images)} images in the background" in lines[1]


def fake_validation(writer, model, tokenizer, step=3):
    trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True, global_step=step,
                              logger=SimpleNamespace(experiment=writer))
    return trainer, SimpleNamespace(model=model, tokenizer=tokenizer, training=False, eval=lambda: None,
                                    train=lambda mode: None)


def test_rendering_runs_off_the_training_thread_and_its_errors_are_logged_not_raised(tmp_path, tokenizer,
                                                                                     monkeypatch, caplog):
    """Only global rank 0 draws: an error raised there would stop that rank alone (the others hang in their next
    collective) or, at the end of fit, skip the test stage and results.json. Drawing failures are logged."""
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=32)).eval()
    maps = AttentionMaps(probes=["Two dogs play."], inches=1.5, dpi=40)
    release, rendered = threading.Event(), []
    write = maps.write
    def slow_write(*args):
        assert threading.current_thread() is not threading.main_thread()
        release.wait(timeout=30)
        rendered.append(write(*args))
        return rendered[-1]
    monkeypatch.setattr(maps, "write", slow_write)
    writer = SummaryWriter(str(tmp_path))
    maps.on_validation_end(*fake_validation(writer, model, tokenizer))
    assert not rendered  # the training thread is back while the images are still to be rendered
    release.set()
    maps.teardown(None, None, "fit")
    assert rendered == [2 * 3]  # 1 probe x 2 heads x (encoder, decoder, cross)

    def failing_write(*args):
        raise ValueError("no font")
    monkeypatch.setattr(maps, "write", failing_write)
    maps.on_validation_end(*fake_validation(writer, model, tokenizer, step=4))
    maps.wait()  # returns: the failure is logged
    maps.teardown(None, None, "fit")
    assert "attention maps at step 4 could not be drawn" in caplog.text and "no font" in caplog.text

    def failing_probes(*args):
        raise RuntimeError("CUDA out of memory")
    monkeypatch.setattr(maps, "attention_weights", failing_probes)
    maps.on_validation_end(*fake_validation(writer, model, tokenizer, step=5))  # returns: logged
    assert "attention maps at step 5: the probes failed" in caplog.text and "out of memory" in caplog.text
    assert maps._render is None
    writer.close()
