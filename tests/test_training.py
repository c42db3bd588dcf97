"""The training recipe: label-smoothed loss (5.4), the learning-rate schedule (5.3), what a
LightningModule step logs, and self-contained checkpoints."""

import math
import random
import time
from functools import partial
from types import SimpleNamespace

import pytest
import sacrebleu
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Timer
from tiny_corpus import tiny_config, write_tiny_corpus

import transformer_nmt
from transformer_nmt.checkpoint import (
    CKPT_DATA_CONFIG,
    CKPT_MODEL_CONFIG,
    CKPT_RUN,
    CKPT_TOKENIZER,
    CKPT_VERSION,
    atomic_torch_save,
    load_checkpoint,
    read_checkpoint,
)
from transformer_nmt.data.config import DataConfig
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.training.app import train
from transformer_nmt.training.callbacks import TokenProgressBar
from transformer_nmt.training.dropout_seeds import dropout_seed
from transformer_nmt.training.loss import label_smoothed_cross_entropy, loss_chunk_elements
from transformer_nmt.training.module import TranslationModule
from transformer_nmt.training.schedules import inverse_sqrt_lr, peak_lr, warmup_inverse_sqrt_lr

# --- loss -------------------------------------------------------------------------------------


def random_batch(vocab=11, pad=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, vocab, generator=g)
    labels = torch.randint(1, vocab, (3, 5), generator=g)
    labels[0, 3:] = pad
    labels[2, 1:] = pad
    return logits, labels


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothing_is_torchs_uniform_smoothing_over_non_pad_tokens(epsilon):
    logits, labels = random_batch()
    loss, nll, n = label_smoothed_cross_entropy(logits, labels, epsilon, pad_id=0)
    expected = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=0, label_smoothing=epsilon,
                               reduction="sum")
    assert n == (labels != 0).sum() == 9
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=0, reduction="sum"))


def test_padding_positions_do_not_change_the_loss():
    logits, labels = random_batch()
    changed = logits.clone()
    changed[labels == 0] = 100.0 * torch.randn_like(changed[labels == 0])
    assert torch.equal(label_smoothed_cross_entropy(logits, labels, 0.1, 0)[0],
                       label_smoothed_cross_entropy(changed, labels, 0.1, 0)[0])


def test_smoothing_penalises_overconfidence():
    """With epsilon > 0 the best logits are not one-hot: a near-one-hot prediction costs more than a softer one."""
    labels = torch.tensor([[1]])
    sharp = torch.full((1, 1, 4), -30.0)
    sharp[0, 0, 1] = 30.0
    soft = torch.zeros(1, 1, 4)
    soft[0, 0, 1] = math.log(0.925 / 0.025)  # q = 0.925 on the label, 0.025 elsewhere: the smoothed target
    loss_soft = label_smoothed_cross_entropy(soft, labels, 0.1, 0)[0]
    assert loss_soft < label_smoothed_cross_entropy(sharp, labels, 0.1, 0)[0]


def label_smoothed_cross_entropy_before(logits, labels, epsilon, pad_id):
    """The loss as it was before the chunked one (kept as the reference): fp32 log-softmax, boolean indexing."""
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    uniform = -log_probs.mean(dim=-1)  # (B, T)
    keep = labels != pad_id  # (B, T)
    smoothed = (1.0 - epsilon) * nll + epsilon * uniform
    return smoothed[keep].sum(), nll[keep].sum(), keep.sum()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, dict(rtol=1e-5, atol=1e-5)),
                                              (torch.bfloat16, dict(rtol=1.6e-2, atol=1e-5)),
                                              (torch.float16, dict(rtol=2e-3, atol=1e-6))])
@pytest.mark.parametrize("overwrite", [False, True])
def test_chunked_loss_has_the_value_and_gradient_of_the_unchunked_one(dtype, tolerance, overwrite):
    """Chunks of 2 rows (so 8 chunks over 15 rows, one ragged), compared with the loss as it was; the logits come
    out of a linear layer, as in the model, so that ``overwrite`` may hand their memory to the gradient."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 5, 8, generator=g)
    weight = torch.randn(37, 8, generator=g)
    labels = torch.randint(1, 37, (3, 5), generator=g)
    labels[0, 2:] = labels[2, 4:] = 0
    results = []
    for loss_fn in (label_smoothed_cross_entropy_before,
                    lambda *a: label_smoothed_cross_entropy(*a, overwrite_logits=overwrite, chunk_elements=2 * 37)):
        w = weight.clone().to(dtype).requires_grad_()
        loss, nll, n = loss_fn(hidden.to(dtype) @ w.t(), labels, 0.1, 0)
        loss.backward()
        results.append((loss, nll, n, w.grad.float()))
    (loss, nll, n, grad), (loss_ref, nll_ref, n_ref, grad_ref) = results[1], results[0]
    assert loss.dtype == nll.dtype == torch.float32 and n == n_ref == 11
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)  # both sum the same logits in fp32
    torch.testing.assert_close(nll, nll_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, grad_ref, **tolerance)  # the logits' gradient is rounded to dtype


def test_loss_chunks_fit_the_cpu_cache_and_few_launches_elsewhere_and_do_not_change_the_loss():
    assert loss_chunk_elements("cpu") == 2 ** 20 and loss_chunk_elements("cuda") == 2 ** 25
    g = torch.Generator().manual_seed(2)
    labels = torch.randint(1, 8000, (300,), generator=g)
    labels[::7] = 0
    results = []
    # the CPU default (3 chunks: 131 rows, 131, 38), one chunk, 42 chunks of 7 rows and one of 6
    for chunk in (None, 2 ** 25, 8000 * 7):
        logits = torch.randn(300, 8000, generator=g.manual_seed(3)).requires_grad_()
        loss, nll, _ = label_smoothed_cross_entropy(logits, labels, 0.1, 0, chunk_elements=chunk)
        loss.backward()
        results.append((loss, nll, logits.grad))
    for loss, nll, grad in results[1:]:
        torch.testing.assert_close(loss, results[0][0], rtol=1e-6, atol=0)
        torch.testing.assert_close(nll, results[0][1], rtol=1e-6, atol=0)
        assert torch.equal(grad, results[0][2])  # row by row: the same arithmetic whatever the chunk


def label_smoothed_cross_entropy_logsumexp(logits, labels, epsilon, pad_id):
    """The chunked loss's previous formula (log-sum-exp written out, before the fused log_softmax/softmax
    kernels), with autograd's gradient, which its hand-written backward equalled."""
    x = logits.float()
    z = torch.logsumexp(x, dim=-1)
    nll = z - x.gather(-1, labels[..., None]).squeeze(-1)
    smoothed = (1.0 - epsilon) * nll + epsilon * (z - x.mean(dim=-1))
    keep = (labels != pad_id).float()
    return (smoothed * keep).sum(), (nll * keep).sum()


@pytest.mark.parametrize("dtype, grad_tolerance", [(torch.float32, dict(rtol=1e-5, atol=1e-7)),
                                                   (torch.bfloat16, dict(rtol=8e-3, atol=1e-7))])
def test_fused_softmax_loss_equals_the_log_sum_exp_formula_it_replaced(dtype, grad_tolerance):
    """At the CPU recipe's scale (an 8k vocabulary; 400 rows, a tenth padding), in fp32 and from bf16 logits: the
    loss and the NLL to fp32 rounding, the gradient to one rounding in the logits' dtype (bf16: 2^-8)."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(400, 8000, generator=g) * 3).to(dtype)
    labels = torch.randint(1, 8000, (400,), generator=g)
    labels[-40:] = 0
    results = []
    for loss_fn in (label_smoothed_cross_entropy_logsumexp, lambda *a: label_smoothed_cross_entropy(*a)[:2]):
        x = logits.clone().requires_grad_()
        loss, nll = loss_fn(x, labels, 0.1, 0)
        loss.backward()
        results.append((loss, nll, x.grad))
    (loss, nll, grad), (loss_ref, nll_ref, grad_ref) = results[1], results[0]
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(nll, nll_ref, rtol=1e-6, atol=0)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.float(), grad_ref.float(), **grad_tolerance)


def test_overwriting_the_logits_with_their_gradient_is_refused_where_it_would_corrupt():
    """A second use of the same logits after the first backward: autograd's version check catches it."""
    logits = (torch.randn(2, 3, 11) * torch.ones(1, requires_grad=True))
    labels = torch.randint(1, 11, (2, 3))
    first = label_smoothed_cross_entropy(logits, labels, 0.1, 0, overwrite_logits=True)[0]
    second = label_smoothed_cross_entropy(logits, labels, 0.1, 0, overwrite_logits=True)[0]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (first + second).backward()


# --- schedule ---------------------------------------------------------------------------------


def test_inverse_sqrt_schedule_warms_up_linearly_then_decays():
    d, warmup = 512, 4000
    peak = inverse_sqrt_lr(warmup, d, warmup)
    assert peak == pytest.approx((d * warmup) ** -0.5)  # the paper's formula at step = warmup: 7.0e-4
    assert inverse_sqrt_lr(1000, d, warmup) == pytest.approx(peak / 4)  # linear rise
    assert inverse_sqrt_lr(16000, d, warmup) == pytest.approx(peak / 2)  # 1/sqrt(step) decay
    assert max(inverse_sqrt_lr(s, d, warmup) for s in range(1, 20000, 7)) <= peak
    assert inverse_sqrt_lr(100, d, warmup, factor=2.0) == pytest.approx(2 * inverse_sqrt_lr(100, d, warmup))


def test_a_peak_given_directly_and_a_warmup_from_an_initial_lr_as_fairseq_states_them():
    """fairseq's inverse_sqrt (--lr 0.005 --warmup-updates 2000 --warmup-init-lr 1e-7): linear from 1e-7 to 0.005
    over 2000 updates, then 0.005 * sqrt(2000 / step). Values computed by hand."""
    lr = partial(warmup_inverse_sqrt_lr, peak=0.005, warmup_steps=2000, init=1e-7)
    assert lr(1000) == pytest.approx(1e-7 + (0.005 - 1e-7) / 2)
    assert lr(2000) == pytest.approx(0.005)
    assert lr(8000) == pytest.approx(0.0025)
    # Without init, a peak of factor * (d * warmup)^-0.5 is the paper's schedule at every step
    d, warmup = 512, 4000
    paper = [inverse_sqrt_lr(s, d, warmup, 1.5) for s in (1, 100, 3999, 4000, 4001, 20000)]
    assert [warmup_inverse_sqrt_lr(s, 1.5 * (d * warmup) ** -0.5, warmup) for s in (1, 100, 3999, 4000, 4001, 20000)] \
        == pytest.approx(paper)
    # The optimizer's lr through the module: train.lr and train.warmup_init_lr as given, the first step at step 1
    module = TranslationModule(dict(vocab_size=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                    d_ff=32), {"lr": 0.005, "warmup_steps": 2000, "warmup_init_lr": 1e-7})
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    optimizer = scheduler.optimizer
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-7 + (0.005 - 1e-7) / 2000)
    for _ in range(1999):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.005)
    assert peak_lr(module.optim, 16) == 0.005
    assert peak_lr({"lr": None, "warmup_steps": 4000, "lr_factor": 1.0}, 512) == pytest.approx((512 * 4000) ** -0.5)



def module_lrs(train: dict, steps: int) -> list[float]:
    """The optimizer's lr at optimizer steps 1..``steps`` through the module's own schedule."""
    module = TranslationModule(dict(vocab_size=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                    d_ff=32), train)
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return lrs


def test_a_constant_schedule_holds_the_peak_after_its_warmup_or_from_the_first_step():
    """train.lr_schedule=constant: linear from warmup_init_lr to train.lr over warmup_steps, then train.lr; with
    warmup_steps=0, train.lr from step 1. Values by hand."""
    assert module_lrs({"lr": 1e-4, "warmup_steps": 0, "lr_schedule": "constant"}, 5) == pytest.approx([1e-4] * 5)
    lrs = module_lrs({"lr": 1e-3, "warmup_steps": 4, "warmup_init_lr": 0.0, "lr_schedule": "constant"}, 8)
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
    # without train.lr the peak is 5.3's factor * (d_model * warmup)^-0.5, held after the warm-up
    lrs = module_lrs({"lr_factor": 2.0, "warmup_steps": 10, "lr_schedule": "constant"}, 30)
    assert lrs[9:] == pytest.approx([2.0 * (16 * 10) ** -0.5] * 21)
    # the default is the paper's: it decays
    assert module_lrs({"lr": 1e-3, "warmup_steps": 4}, 16)[-1] == pytest.approx(1e-3 * (4 / 16) ** 0.5)


@pytest.mark.parametrize("train, message", [
    ({"warmup_steps": 0}, r"train.warmup_steps=0: the inverse square root schedule peaks at step warmup_steps"),
    ({"lr_schedule": "cosine"}, r"train.lr_schedule='cosine': use one of inverse_sqrt, constant"),
    ({"lr_schedule": "constant", "warmup_steps": -1}, r"train.warmup_steps=-1")])
def test_a_schedule_that_cannot_run_is_refused_naming_the_option(train, message):
    with pytest.raises(ValueError, match=message):
        module_lrs(train, 1)

def test_activation_dropout_drops_inside_the_feed_forward_only_in_training():
    from transformer_nmt.model.feed_forward import FeedForward

    torch.manual_seed(0)
    ff = FeedForward(8, 32, "relu", dropout=0.5)
    x = torch.randn(2, 3, 8)
    hidden = torch.relu(ff.linear1(x))
    ff.train()
    torch.manual_seed(1)
    out = ff(x)
    torch.manual_seed(1)
    from transformer_nmt.model.dropout import dropout
    assert torch.equal(out, ff.linear2(dropout(hidden, 0.5)))  # the mask falls on the d_ff activations
    assert not torch.allclose(out, ff.linear2(hidden))
    ff.eval()
    assert torch.equal(ff(x), ff.linear2(hidden))
    assert set(FeedForward(8, 32, "relu", 0.1).state_dict()) == set(FeedForward(8, 32).state_dict())  # no weights


def test_dropout_seeds_depend_on_rank_and_position_only():
    """A resumed run draws the masks of an uninterrupted one: the seed is a function of (seed, rank, optimizer step,
    batch index) alone, whatever the random state, the process (PYTHONHASHSEED) or the project's version. The known
    values: CPython's (3.8+, 64-bit) hash of the tuple, to 63 bits, as `PYTHONHASHSEED=0|1|random python3 -c
    "print(hash((1, 0, 5, 5)) & (2**63 - 1))"` prints it."""
    torch.manual_seed(123)
    torch.rand(10)  # the global generators moved: no influence
    random.seed(7)
    assert dropout_seed(1, 0, 5, 5) == 7349437577759620136
    assert dropout_seed(1, 1, 5, 5) == 856066167798558127  # another rank
    assert dropout_seed(2, 0, 5, 5) == 8378958508802670346  # another run seed
    seeds = {dropout_seed(1, r, s, b) for r in range(2) for s in range(10) for b in range(10)}
    assert len(seeds) == 200 and all(0 <= seed < 2 ** 63 for seed in seeds)  # torch.manual_seed's range


# --- the LightningModule in a Trainer ---------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def accumulated_run(corpus, tmp_path_factory):
    """3 optimizer steps of 2 accumulated batches each, with a validation (BLEU) at the end."""
    run_dir = tmp_path_factory.mktemp("run")
    trainer = train(tiny_config(corpus, "trainer.max_steps=3", "trainer.accumulate_grad_batches=2",
                                "trainer.val_check_interval=6", "train.clip_grad_norm=1.0",
                                "checkpoint.every_n_train_steps=3"), run_dir)
    return trainer, run_dir


def test_lr_schedule_steps_once_per_optimizer_step_under_accumulation(accumulated_run):
    trainer, _ = accumulated_run
    module = trainer.lightning_module
    assert trainer.global_step == 3
    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == 6  # micro-batches
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == 3
    optimizer = trainer.optimizers[0]
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    assert optimizer.state[module.model.src_embed.weight]["step"] == 3
    d_model, warmup = module.model.config.d_model, module.optim["warmup_steps"]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(inverse_sqrt_lr(4, d_model, warmup))  # the next step's
    assert float(trainer.callback_metrics["train/lr"]) == pytest.approx(inverse_sqrt_lr(3, d_model, warmup))


def test_a_step_logs_loss_perplexity_lr_grad_norm_and_throughput(accumulated_run):
    metrics = accumulated_run[0].callback_metrics
    for key in ("train/loss", "train/ppl", "train/lr", "train/grad_norm", "train/src_tokens_per_step",
                "train/tgt_tokens_per_step", "train/tgt_tokens_per_sec", "val/loss", "val/ppl", "val/bleu"):
        assert key in metrics, key
    assert 0 < float(metrics["train/tgt_tokens_per_step"]) <= 2 * 512  # two batches of <= max_tokens


def test_validation_scores_are_those_of_the_final_weights_on_the_val_split(accumulated_run, corpus):
    """The validation ran after the last step (val_check_interval 6 micro-batches = 3 steps): its loss and perplexity
    are torch's cross-entropy of the final weights over the val split (label-smoothed with epsilon 0.1, and plain),
    per target token; its BLEU is sacreBLEU's over the first 8 sentences (train.val_bleu_max_sentences) against
    the corpus file's references, the hypotheses the final weights' greedy search, one sentence at a time."""
    from transformer_nmt.generation.search import greedy_decode

    trainer, _ = accumulated_run
    metrics, module = trainer.callback_metrics, trainer.lightning_module
    model, tokenizer, pad = module.model, module.tokenizer, module.model.config.pad_id
    smoothed = nll = tokens = 0.0
    model.eval()
    with torch.no_grad():
        for batch in trainer.datamodule.val_dataloader():
            logits = model(batch["src"], batch["tgt"][:, :-1]).flatten(0, 1).double()  # (B (T-1), V)
            labels = batch["tgt"][:, 1:].flatten()  # (B (T-1),)
            smoothed += float(F.cross_entropy(logits, labels, ignore_index=pad, label_smoothing=0.1, reduction="sum"))
            nll += float(F.cross_entropy(logits, labels, ignore_index=pad, reduction="sum"))
            tokens += int((labels != pad).sum())
        sources = (corpus / "val.en").read_text(encoding="utf-8").splitlines()[:8]
        hypotheses = [tokenizer.decode(greedy_decode(model, torch.tensor([ids + [tokenizer.eos_id]]),
                                                     bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                                                     max_len_offset=DecodeConfig().max_len_offset)[0])
                      for ids in tokenizer.encode_batch(sources)]
    model.train()
    targets = tokenizer.encode_batch((corpus / "val.de").read_text(encoding="utf-8").splitlines())
    assert tokens == sum(len(ids) + 1 for ids in targets)  # every sentence of the split, its eos included
    assert float(metrics["val/loss"]) == pytest.approx(smoothed / tokens, rel=1e-5)
    assert float(metrics["val/ppl"]) == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    references = (corpus / "val.de").read_text(encoding="utf-8").splitlines()[:8]
    assert module.hypotheses["val"] == dict(enumerate(hypotheses))
    assert int(metrics["val/bleu_sentences"]) == 8
    assert float(metrics["val/bleu"]) == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score,
                                                       abs=1e-4)


def test_checkpoints_are_self_contained_and_load_with_weights_only(accumulated_run):
    trainer, run_dir = accumulated_run
    path = run_dir / "checkpoints" / "last.ckpt"
    raw = torch.load(path, weights_only=True)  # plain containers, tensors and bytes only
    assert isinstance(raw[CKPT_TOKENIZER], bytes) and isinstance(raw[CKPT_MODEL_CONFIG], dict)
    assert DataConfig.from_record(raw[CKPT_DATA_CONFIG], str(path)).corpus_spec().locations["train"].endswith("train")
    assert "_target_" not in raw[CKPT_DATA_CONFIG]  # data options only: nothing a reader would instantiate
    assert type(raw["hyper_parameters"]["model_config"]) is dict
    assert raw[CKPT_VERSION] == transformer_nmt.__version__ and raw[CKPT_RUN] == trainer.lightning_module.training_run
    assert read_checkpoint(path)["global_step"] == 3

    model, tokenizer, meta = load_checkpoint(path)
    assert isinstance(model, Transformer) and not model.training
    assert meta["global_step"] == 3 and meta["model_config"]["d_model"] == 64
    module = trainer.lightning_module
    assert tokenizer.model_proto == module.tokenizer.model_proto
    for name, value in model.state_dict().items():
        assert torch.equal(value, module.model.state_dict()[name].cpu()), name


def test_the_module_wraps_a_plain_transformer():
    module = TranslationModule({"vocab_size": 20, "d_model": 16, "n_heads": 2, "n_encoder_layers": 1,
                                "n_decoder_layers": 1, "d_ff": 32})
    assert type(module.model) is Transformer
    assert not any("lightning" in type(m).__module__ for m in module.model.modules())
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rate'"):  # TrainConfig's fields only
        TranslationModule({"vocab_size": 20, "d_model": 16, "n_heads": 2}, {"learning_rate": 1.0})


def test_accumulated_gradient_is_the_per_token_mean_over_the_whole_optimizer_step(corpus, tmp_path):
    """Two micro-batches of different token counts: the update must weigh every token alike, i.e. equal
    the gradient of (summed token loss of both) / (their target tokens), not the mean of two means."""
    import copy

    import lightning.pytorch as pl

    from transformer_nmt.data.config import DataConfig
    from transformer_nmt.data.datamodule import TranslationDataModule
    from transformer_nmt.training.loss import label_smoothed_cross_entropy
    from transformer_nmt.training.module import TranslationModule

    datamodule = TranslationDataModule(DataConfig(train=f"{corpus}/train", val=f"{corpus}/val", test=None,
                                                  cache_dir=str(tmp_path / "cache"), vocab_size=256, max_tokens=300,
                                                  num_proc=1))
    datamodule.setup("fit")
    config = dict(vocab_size=datamodule.tokenizer.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
                  n_decoder_layers=1, d_ff=32, dropout=0.0)

    class Recording(TranslationModule):
        def on_train_batch_start(self, batch, batch_idx):
            self.seen = getattr(self, "seen", []) + [copy.deepcopy(batch)]
            super().on_train_batch_start(batch, batch_idx)

        def on_before_optimizer_step(self, optimizer):
            super().on_before_optimizer_step(optimizer)
            self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters()}

    torch.manual_seed(0)
    module = Recording(config, dict(label_smoothing=0.1, val_bleu_max_sentences=0), tokenizer=datamodule.tokenizer)
    reference = copy.deepcopy(module.model)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(module, datamodule=datamodule)

    counts = [int((b["tgt"][:, 1:] != 0).sum()) for b in module.seen]
    assert len(counts) == 2 and counts[0] != counts[1]  # unequal micro-batches: the case that matters
    total = 0.0
    for batch in module.seen:
        logits = reference(batch["src"], batch["tgt"][:, :-1])
        total = total + label_smoothed_cross_entropy(logits, batch["tgt"][:, 1:], 0.1, 0)[0]
    (total / sum(counts)).backward()
    for name, param in reference.named_parameters():
        torch.testing.assert_close(module.grads[name], param.grad, atol=1e-6, rtol=1e-4)


def test_compile_compiles_the_forward_in_place_and_keeps_parameter_names(monkeypatch):
    """train.compile=true: the training step runs the model through torch.compile and gives the eager step's loss
    and gradients. The compiler is the module's own call (nn.Module.compile -> torch.compile) with a backend that
    counts the graphs it is handed and runs them as traced (inductor would take minutes here)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    torch_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: torch_compile(fn, **{**kwargs, "backend": counter}))
    torch._dynamo.reset()
    config = {"vocab_size": 20, "d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32,
              "dropout": 0.0}
    eager, compiled = TranslationModule(config), TranslationModule(config, {"compile": True})
    assert eager.model._compiled_call_impl is None and compiled.model._compiled_call_impl is not None
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints load either way
    compiled.load_state_dict(eager.state_dict())
    g = torch.Generator().manual_seed(0)
    batch = {"src": torch.randint(4, 20, (3, 7), generator=g), "tgt": torch.randint(4, 20, (3, 6), generator=g)}
    batch["src"][0, 5:] = batch["tgt"][1, 4:] = 0  # padding
    losses = []
    for module in (eager, compiled):
        loss = module.training_step(batch, 0)
        loss.backward()
        losses.append(loss)
    assert counter.frame_count >= 1 and counter.op_count > 0  # the compiled path ran
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-5, atol=1e-7, msg=name)
    torch._dynamo.reset()


def test_padding_to_a_multiple_of_8_keeps_the_token_budget():
    """train.compile pads batch widths to a multiple of 8; the sampler packs by the rounded widths."""
    import numpy as np

    from transformer_nmt.data.batching import TokenBucketBatchSampler, pad_pairs, pair_widths

    g = np.random.default_rng(0)
    src_lens, tgt_lens = g.integers(1, 40, 300), g.integers(1, 40, 300)
    sampler = TokenBucketBatchSampler(pair_widths(src_lens, tgt_lens), max_tokens=400, pad_to_multiple=8)
    for batch in sampler:
        ragged = [(np.ones(int(lens[batch].sum()), dtype=np.int64), np.r_[0, np.cumsum(lens[batch])])
                  for lens in (src_lens, tgt_lens)]
        padded = pad_pairs(*ragged, batch, multiple=8)
        for side in ("src", "tgt"):
            assert padded[side].shape[1] % 8 == 0 and padded[side].numel() <= 400
        assert padded["src"].shape[1] - 8 < int(src_lens[batch].max()) + 1  # no more than 7 columns added


def test_resume_from_last_without_a_checkpoint_names_the_run_dir_option(corpus, tmp_path):
    from transformer_nmt.training.run_dir import LaunchError

    with pytest.raises(LaunchError, match="ckpt_path=last: no checkpoints/last.ckpt in .*hydra.run.dir"):
        train(tiny_config(corpus, "ckpt_path=last"), tmp_path / "fresh_run")


def test_resuming_refuses_another_vocabulary_and_pre_in_proj_optimizer_state(tmp_path):
    """on_load_checkpoint: a checkpoint whose SentencePiece model differs from the data's stops the resume
    (the ids would mean other pieces); a pre-in_proj checkpoint's weights load (read_checkpoint stacks them:
    checkpoint.migrate_checkpoint), but its optimizer state cannot resume (Lightning's loader refuses it)."""
    from toy_sentences import sentences

    from transformer_nmt.data.tokenizer import train_sentencepiece
    from transformer_nmt.training.checkpoint_io import AtomicCheckpointIO

    ours, other = (train_sentencepiece(iter(sentences(seed=seed)), vocab_size=size, seed=1)
                   for seed, size in ((0, 120), (1, 100)))
    config = {"vocab_size": 120, "d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32}
    module = TranslationModule(config, tokenizer=ours)
    module.on_load_checkpoint({CKPT_TOKENIZER: ours.model_proto})  # the same vocabulary: fine
    with pytest.raises(ValueError, match="another SentencePiece vocabulary.*data.tokenizer_path"):
        module.on_load_checkpoint({CKPT_TOKENIZER: other.model_proto})
    old = {f"model.encoder_layers.0.self_attn.{name}_proj.weight": torch.full((2, 3), float(i))
           for i, name in enumerate("qkv")}
    atomic_torch_save({"optimizer_states": [{}], "state_dict": old, CKPT_MODEL_CONFIG: config,
                       CKPT_TOKENIZER: ours.model_proto}, tmp_path / "old.ckpt")
    weights = read_checkpoint(tmp_path / "old.ckpt")["state_dict"]  # loading weights (evaluate, translate, average)
    assert list(weights) == ["model.encoder_layers.0.self_attn.in_proj.weight"]
    assert torch.equal(weights["model.encoder_layers.0.self_attn.in_proj.weight"], torch.cat(list(old.values())))
    with pytest.raises(ValueError, match="predates the fused Q/K/V projection"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "old.ckpt")  # Lightning's loader: resuming


class _FixedTimer(Timer):
    def __init__(self, remaining: float | None):
        super().__init__(duration=None)
        self.remaining = remaining

    def time_remaining(self, stage="train"):
        return self.remaining


@pytest.mark.parametrize("remaining, expected", [(None, 90.0), (1000.0, 90.0), (30.0, 30.0), (-5.0, 0.0)])
def test_progress_bar_eta_ends_at_max_steps_or_max_time_whichever_comes_first(monkeypatch, remaining, expected):
    """10 steps in 10 s, 90 steps left by max_steps: 90 s, unless max_time (the Timer) leaves less."""
    bar = TokenProgressBar()
    monkeypatch.setattr(time, "perf_counter", lambda: 110.0)
    trainer = SimpleNamespace(global_step=10, max_steps=100, max_epochs=-1, num_training_batches=float("inf"),
                              accumulate_grad_batches=1, callbacks=[_FixedTimer(remaining)])
    bar._start = (100.0, 0)  # (perf_counter, global_step) when training started
    assert bar.eta_seconds(trainer) == pytest.approx(expected)
    trainer.callbacks = []
    assert bar.eta_seconds(SimpleNamespace(**{**vars(trainer), "max_steps": -1})) is None  # no limit at all
