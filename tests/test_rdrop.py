"""R-Drop (train.rdrop_alpha, training/rdrop.py): the symmetric KL against torch's kl_div in float64, value and
gradient, padding ignored, chunks changing nothing; the training step's objective and gradient against the paper's
loss written out with torch's own functions over the same two dropout masks; no dropout makes it the plain step; a
bad alpha refused naming the option; a run logs the divergence and counts each target token once."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.training.app import train
from transformer_nmt.training.module import LOSS_SCALE_TOKENS, TranslationModule
from transformer_nmt.training.rdrop import check_alpha, symmetric_kl, two_passes

PAD = 0


def kl_reference(x, y, labels):
    """KL(p || q) + KL(q || p) over the non-pad positions, p = softmax(x), q = softmax(y), from torch.kl_div."""
    a, b = F.log_softmax(x, dim=-1), F.log_softmax(y, dim=-1)
    keep = (labels != PAD)[..., None]
    return ((F.kl_div(b, a, log_target=True, reduction="none") + F.kl_div(a, b, log_target=True, reduction="none"))
            * keep).sum()


def random_logits(seed=0, shape=(3, 5, 13)):
    generator = torch.Generator().manual_seed(seed)
    x, y = (3 * torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(2))
    labels = torch.randint(1, shape[-1], shape[:2], generator=generator)
    labels[0, 3:] = PAD  # a padded sentence
    labels[2, 1:] = PAD
    return x, y, labels


@pytest.mark.parametrize("chunk_elements", [1, 3 * 13, None])  # a row per chunk, three, all in one
def test_the_divergence_and_its_gradient_are_torchs_kl_div_both_ways(chunk_elements):
    x, y, labels = random_logits()
    x.requires_grad_(True), y.requires_grad_(True)
    value = symmetric_kl(x, y, labels, PAD, chunk_elements=chunk_elements)
    value.backward()
    ours = (x.grad.clone(), y.grad.clone())
    x.grad, y.grad = None, None
    reference = kl_reference(x, y, labels)
    reference.backward()
    assert value.dtype == torch.float32 and reference > 1.0  # far from 0: two unrelated distributions
    assert value.item() == pytest.approx(reference.item(), rel=1e-6)
    torch.testing.assert_close(ours[0], x.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours[1], y.grad, atol=1e-6, rtol=1e-5)
    assert ours[0][labels == PAD].abs().max() == 0 and ours[1][labels == PAD].abs().max() == 0


def test_padding_positions_change_nothing_and_equal_distributions_give_zero():
    x, y, labels = random_logits(seed=1)
    moved = x.clone()
    moved[labels == PAD] += 100 * torch.randn_like(moved[labels == PAD])
    assert symmetric_kl(moved, y, labels, PAD).item() == symmetric_kl(x, y, labels, PAD).item()
    assert symmetric_kl(x, x + 7.0, labels, PAD).abs().item() < 1e-5  # softmax is shift-invariant
    with pytest.raises(ValueError, match="differ in shape"):
        symmetric_kl(x, y[:, :4], labels, PAD)


@pytest.mark.parametrize("alpha", [-1.0, float("nan"), float("inf"), "5", True])
def test_a_bad_alpha_is_refused_naming_the_option(alpha):
    with pytest.raises(ValueError, match=r"train\.rdrop_alpha="):
        check_alpha(alpha)
    config = dict(vocab_size=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32)
    with pytest.raises(ValueError, match=r"train\.rdrop_alpha="):
        TranslationModule(config, {"rdrop_alpha": alpha})


def batch(vocab=23, seed=0):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (4, 7), generator=generator)
    tgt = torch.randint(4, vocab, (4, 6), generator=generator)
    src[1, 5:] = PAD
    tgt[2, 4:] = PAD
    return {"src": src, "tgt": tgt}


def module(alpha: float, dropout: float) -> TranslationModule:
    torch.manual_seed(0)
    config = dict(vocab_size=23, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32,
                  dropout=dropout, attention_dropout=dropout, pad_id=PAD)
    step = TranslationModule(config, {"rdrop_alpha": alpha, "label_smoothing": 0.1})
    step.train()
    return step


def papers_objective(logits, labels, alpha, epsilon=0.1):
    """-log P1 - log P2 + alpha / 2 (KL(P1 || P2) + KL(P2 || P1)), label-smoothed, summed over target tokens,
    halved: from torch's cross_entropy and kl_div, the two passes the two halves of the stacked batch's logits."""
    half = logits.shape[0] // 2
    first, second = logits[:half], logits[half:]
    vocab = logits.shape[-1]
    ce = sum(F.cross_entropy(p.reshape(-1, vocab).float(), labels.reshape(-1), label_smoothing=epsilon,
                             ignore_index=PAD, reduction="sum") for p in (first, second))
    return (ce + alpha / 2 * kl_reference(first.float(), second.float(), labels)) / 2


def test_the_step_trains_on_the_papers_objective_over_two_dropout_masks():
    """The step's loss and gradients against the paper's loss written out with torch's functions, over the same
    stacked forward (the same seed draws the same two masks): the step computes what R-Drop defines."""
    data, alpha = batch(), 2.0
    step = module(alpha, dropout=0.3)
    reference = copy.deepcopy(step.model)
    torch.manual_seed(7)
    loss = step.training_step(data, 0)
    (loss * LOSS_SCALE_TOKENS).backward()
    torch.manual_seed(7)
    src, tgt_in, labels = data["src"], data["tgt"][:, :-1], data["tgt"][:, 1:]
    logits = reference(*two_passes(src, tgt_in))  # (8, 5, 23)
    half = logits.shape[0] // 2
    assert not torch.equal(logits[:half], logits[half:])  # two masks
    expected = papers_objective(logits, labels, alpha)
    expected.backward()
    assert (loss * LOSS_SCALE_TOKENS).item() == pytest.approx(expected.item(), rel=1e-5)
    kl = step._step_sums[4].item()
    assert kl > 1e-3  # the masks differ, so do the passes
    tokens = int((labels != PAD).sum())
    assert step._step_sums[1].item() == tokens  # each target token counted once, not once per pass
    for (name, ours), theirs in zip(step.model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_without_dropout_the_two_passes_agree_and_the_step_is_the_plain_one():
    data = batch(seed=3)
    plain, rdrop = module(0.0, dropout=0.0), module(5.0, dropout=0.0)
    rdrop.model.load_state_dict(plain.model.state_dict())
    losses = [step.training_step(data, 0) for step in (plain, rdrop)]
    for step, loss in zip((plain, rdrop), losses):
        loss.backward()
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-6)
    assert abs(rdrop._step_sums[4].item()) < 1e-6 and plain._step_sums[4].item() == 0
    torch.testing.assert_close(rdrop._step_sums[:4], plain._step_sums[:4], rtol=1e-6, atol=0)
    for (name, a), b in zip(plain.model.named_parameters(), rdrop.model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_a_run_logs_the_divergence_and_its_tokens_once(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus")
    trainer = train(tiny_config(corpus, "trainer.max_steps=2", "train.rdrop_alpha=1.0", "trainer.log_every_n_steps=1",
                                "train.val_bleu_max_sentences=0"), tmp_path / "run")
    metrics = trainer.callback_metrics
    assert float(metrics["train/rdrop_kl"]) > 0
    assert 0 < float(metrics["train/tgt_tokens_per_step"]) <= 512  # data.max_tokens of one batch: not doubled
    assert trainer.lightning_module.rdrop_alpha == 1.0
