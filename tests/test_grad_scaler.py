"""16-mixed with fused Adam: what reads the gradients before the optimizer's step (clipping, ``train/grad_norm``,
the non-finite check) sees them unscaled, as it does with any other optimizer.

Lightning unscales before ``on_before_optimizer_step`` only for optimizers that cannot unscale inside their own
step; fused Adam can (``_step_supports_amp_scaling``), so it left the gradients at the loss scale there:
clipping cut them by the scale's factor and the logged norm was the scale times too large. The module's step
(``on_before_optimizer_step``) is run here as Lightning's MixedPrecision runs it (scaled backward, the hook, then
``GradScaler.step``), against the same step without a scaler and with Adam unfused.
"""

import copy

import pytest
import torch

import transformer_nmt.training.module as module_
from transformer_nmt.training.module import TranslationModule

SCALE = 2.0 ** 12
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


class StandInTrainer:
    """What the module's step reads of its Trainer: one process, no accumulation, never a logging step."""

    accumulate_grad_batches = world_size = 1
    global_rank = global_step = 0
    log_every_n_steps, should_stop = 0, False

    def __init__(self, scaler):
        self.precision_plugin = type("Plugin", (), {"scaler": scaler})()


def step_parts(device: str, clip: float | None):
    """Two copies of one small module (dropout 0, so their forwards agree) and one batch."""
    torch.manual_seed(0)
    config = {"vocab_size": 40, "d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1,
              "d_ff": 32, "dropout": 0.0}
    module = TranslationModule(config, {"clip_grad_norm": clip}).to(device)
    batch = {"src": torch.randint(4, 40, (3, 7), device=device), "tgt": torch.randint(4, 40, (3, 6), device=device)}
    return module, copy.deepcopy(module), batch


def run_step(module, optimizer, batch, scaler, norms, monkeypatch) -> torch.Tensor:
    """One optimizer step as Lightning's MixedPrecision plugin runs it (with ``scaler``; without: Precision's):
    returns the gradients as the hook left them, flattened."""
    module._trainer = StandInTrainer(scaler)
    loss = module.training_step(batch, 0)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None and not getattr(optimizer, "_step_supports_amp_scaling", False):
        scaler.unscale_(optimizer)  # what Lightning does for the optimizers that cannot
    clip_grad_norm = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda *a, **k: norms.append(clip_grad_norm(*a, **k)) or norms[-1])
    module.on_before_optimizer_step(optimizer)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm)
    grads = torch.cat([p.grad.flatten() for p in module.parameters()])
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("clipped", [False, True])
def test_fused_adam_under_a_gradient_scaler_clips_logs_and_steps_the_unscaled_gradients(device, clipped,
                                                                                         monkeypatch):
    fused, plain, batch = step_parts(device, clip=None)
    if clipped:  # a threshold half the true norm: clipping acts
        probe = copy.deepcopy(plain)
        probe._trainer = StandInTrainer(None)
        probe.training_step(batch, 0).backward()
        probe.on_before_optimizer_step(torch.optim.SGD(probe.parameters(), lr=0.0))
        clip = 0.5 * torch.cat([p.grad.flatten() for p in probe.parameters()]).norm().item()
        fused.optim["clip_grad_norm"] = plain.optim["clip_grad_norm"] = clip
    scaler = torch.amp.GradScaler(device, init_scale=SCALE)
    fused_adam = torch.optim.Adam(fused.parameters(), lr=1e-2, fused=True)
    assert fused_adam._step_supports_amp_scaling  # the case Lightning leaves scaled
    plain_adam = torch.optim.Adam(plain.parameters(), lr=1e-2, foreach=False)
    fused_norms, plain_norms = [], []
    fused_grads = run_step(fused, fused_adam, batch, scaler, fused_norms, monkeypatch)
    plain_grads = run_step(plain, plain_adam, batch, None, plain_norms, monkeypatch)
    # the norm the module logs as train/grad_norm and clips by: the true one (fp32 rounding apart)
    torch.testing.assert_close(fused_norms[0], plain_norms[0], rtol=1e-5, atol=0.0)
    torch.testing.assert_close(fused_grads, plain_grads, rtol=1e-5, atol=1e-8)
    if clipped:
        assert fused_grads.norm().item() == pytest.approx(clip, rel=1e-4)
    for a, b in zip(fused.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)  # fused and unfused Adam: the same update
    assert scaler.get_scale() == SCALE  # no overflow: the scale kept


@pytest.mark.parametrize("device", DEVICES)
def test_an_overflowed_step_is_still_skipped_once_the_module_unscaled_it(device, monkeypatch):
    """The scaler's inf check, made when the module unscales, reaches the fused step: it skips the update."""
    module, _, batch = step_parts(device, clip=None)
    scaler = torch.amp.GradScaler(device, init_scale=SCALE)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2, fused=True)
    before = [p.detach().clone() for p in module.parameters()]
    module._trainer = StandInTrainer(scaler)
    scaler.scale(module.training_step(batch, 0)).backward()
    module.model.src_embed.weight.grad[5, 0] = float("inf")  # an fp16 overflow
    module.on_before_optimizer_step(optimizer)
    module.check_finite()  # a scaler's overflow is not fatal: it skips the step
    scaler.step(optimizer)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    assert scaler.get_scale() == SCALE / 2


def test_an_optimizer_lightning_unscales_is_not_unscaled_twice():
    """Unfused Adam: Lightning has unscaled it before the hook (unscaling twice would raise)."""
    module, _, _ = step_parts("cpu", clip=None)
    optimizer = torch.optim.Adam(module.parameters(), foreach=False)
    assert not getattr(optimizer, "_step_supports_amp_scaling", False)
    calls = []
    scaler = type("Scaler", (), {"unscale_": lambda self, o: calls.append(o)})()
    module_.unscale_for_fused_step(StandInTrainer(scaler), optimizer)
    module_.unscale_for_fused_step(StandInTrainer(None), torch.optim.Adam(module.parameters(), fused=True))
    assert calls == []
