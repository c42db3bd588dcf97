"""train.ema_decay: the moving average follows its formula, is what validation and the checkpoints' decoding weights
hold (the trained weights kept beside it), and a resumed run ends with the average and the weights of an
uninterrupted one, bit for bit."""

import lightning.pytorch as pl
import pytest
import torch
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import load_checkpoint, read_checkpoint
from transformer_nmt.training.app import train
from transformer_nmt.training.ema import CKPT_EMA, CKPT_RAW_WEIGHTS, WeightEMA

TOTAL_STEPS = 14  # the tiny corpus makes 10 batches per epoch: the runs cross an epoch boundary


@pytest.mark.parametrize("warmup", [True, False])
def test_the_average_follows_its_formula_in_float64(warmup):
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3)
    ema = WeightEMA(layer, 0.9, warmup=warmup)
    reference = {name: p.detach().double().clone() for name, p in layer.named_parameters()}
    for t in range(1, 30):
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(torch.randn_like(p))
        ema.update()
        d = min(0.9, (1 + t) / (10 + t)) if warmup else 0.9
        for name, p in layer.named_parameters():
            reference[name] = d * reference[name] + (1 - d) * p.detach().double()
    for name, value in ema.averaged_weights().items():
        torch.testing.assert_close(value.double(), reference[name], rtol=1e-5, atol=1e-6)
    assert ema.updates == 29


def test_swapping_the_average_in_restores_the_trained_weights_exactly():
    layer = torch.nn.Linear(4, 4)
    ema = WeightEMA(layer, 0.5, warmup=False)
    with torch.no_grad():
        layer.weight.add_(1.0)
    ema.update()
    trained = layer.weight.detach().clone()
    with ema.swapped_in():
        assert torch.equal(layer.weight, ema.average[0]) and not torch.equal(layer.weight, trained)
        assert torch.equal(ema.trained_weights()["weight"], trained)
    assert torch.equal(layer.weight, trained)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_a_decay_outside_zero_one_is_refused(decay):
    with pytest.raises(ValueError, match="train.ema_decay must be in"):
        WeightEMA(torch.nn.Linear(2, 2), decay)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


class SeenAtValidation(pl.Callback):
    """A weight as validation sees it, and the average at that moment."""

    def __init__(self):
        self.seen = []

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and module.ema is not None and not trainer.sanity_checking:
            self.seen.append((module.model.src_embed.weight.detach().clone(), module.ema.average[0].clone(),
                              module.ema.trained_weights()["model.src_embed.weight"].clone()))


def run(corpus, run_dir, max_steps, *overrides):
    cfg = tiny_config(corpus, f"trainer.max_steps={max_steps}", "trainer.val_check_interval=5",
                      "train.ema_decay=0.9", *overrides)
    return train(cfg, run_dir)


def test_validation_and_the_checkpoint_hold_the_average_and_the_trained_weights_stay_beside_it(corpus, tmp_path,
                                                                                             monkeypatch):
    seen = SeenAtValidation()
    from transformer_nmt.training import app
    build = app.build_callbacks
    monkeypatch.setattr(app, "build_callbacks", lambda *a, **k: [*build(*a, **k), seen])
    trainer = run(corpus, tmp_path, 6)
    module = trainer.lightning_module
    assert module.ema.names[0] == "model.src_embed.weight"
    assert seen.seen, "no validation ran"
    for in_model, average, trained in seen.seen:
        assert torch.equal(in_model, average) and not torch.equal(in_model, trained)
    checkpoint = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    decoding, raw = checkpoint["state_dict"], checkpoint[CKPT_RAW_WEIGHTS]
    model_now = {k: v for k, v in module.state_dict().items()}
    assert decoding.keys() == raw.keys() == model_now.keys()
    for name, value in raw.items():  # the trained weights: the model's, after training
        assert torch.equal(value, model_now[name]), name
    for name, value in module.ema.averaged_weights().items():
        assert torch.equal(decoding[name], value), name
    assert sum(not torch.equal(decoding[k], raw[k]) for k in raw) > 10
    assert checkpoint[CKPT_EMA] == {"decay": 0.9, "warmup": True, "updates": 6}
    model, _, _ = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")  # what translate / evaluate decode with
    assert torch.equal(model.src_embed.weight, decoding["model.src_embed.weight"])


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    trainer = run(corpus, tmp_path_factory.mktemp("uninterrupted"), TOTAL_STEPS)
    module = trainer.lightning_module
    return ({k: v.detach().clone() for k, v in module.state_dict().items()},
            {k: v.clone() for k, v in module.ema.averaged_weights().items()})


@pytest.mark.parametrize("stop", [4, 10], ids=["mid-epoch", "epoch-boundary"])
def test_a_resumed_run_ends_with_the_average_and_weights_of_an_uninterrupted_one(corpus, uninterrupted, tmp_path,
                                                                                 stop):
    run(corpus, tmp_path, stop, f"checkpoint.every_n_train_steps={stop}")
    resumed = run(corpus, tmp_path, TOTAL_STEPS, f"checkpoint.every_n_train_steps={stop}", "ckpt_path=last")
    assert resumed.global_step == TOTAL_STEPS
    weights, average = uninterrupted
    module = resumed.lightning_module
    for name, value in module.state_dict().items():
        assert torch.equal(value, weights[name]), f"resumed at {stop}: {name}"
    for name, value in module.ema.averaged_weights().items():
        assert torch.equal(value, average[name]), f"resumed at {stop}: the average of {name}"
    assert module.ema.updates == TOTAL_STEPS


def test_resuming_an_ema_run_without_ema_is_refused(corpus, tmp_path):
    run(corpus, tmp_path, 2, "checkpoint.every_n_train_steps=2")
    with pytest.raises(Exception, match="train.ema_decay"):
        train(tiny_config(corpus, "trainer.max_steps=4", "trainer.val_check_interval=5",
                          "checkpoint.every_n_train_steps=2"), tmp_path)
