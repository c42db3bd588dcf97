"""Model FLOPs of a training step, and the matrix-product ceiling they are measured against (MFU).

Model FLOPs per training batch (forward + backward; the convention of Kaplan et al. 2020 and PaLM's MFU):
6 x (encoder parameters x source tokens + (decoder parameters + output layer) x target tokens) for the
matrix products, plus the attention scores and their weighted sums, 6 x h (d_k + d_v) x (sum over sentences
and layers of Lq x Lk: encoder self, decoder self (the causal half counted in full, as the kernels compute
it), cross). Tokens are real (non-padding) ones; the target's are those with a loss (``tgt[:, 1:]``). The
output layer is d_model x vocab whether or not it is tied with the embeddings, whose lookup is no matmul.
Layer norms and biases count as parameters (a rounding error). scripts/gpu_check.py and the training
run's time budget (time_budget.py) use this one definition.

The ceiling: the rate of this process's matrix products at the model's own shapes, (tokens x d_model) times
(d_model x d_ff) and (tokens x d_model) times (d_model x vocab), in the run's compute dtype and thread count
(``matmul_ceiling``). Model FLOP/s over that rate is the share of what the hardware's matmul reaches here.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class FlopCount:
    """What the FLOPs of a batch depend on, read once from a model: ``FlopCount.of(model)(src, tgt)``."""

    encoder_params: int
    decoder_params: int  # decoder layers and the output layer (vocab x d_model)
    attention_width: int  # h (d_k + d_v): the multiply-adds per query-key pair, QK^T and AV together
    n_encoder_layers: int
    n_decoder_layers: int
    pad_id: int = 0

    @classmethod
    def of(cls, model: nn.Module) -> FlopCount:
        """From a ``model.Transformer`` (or anything with its ``config`` and parameter names)."""
        c = model.config
        d_k, d_v = c.head_dims()
        named = list(model.named_parameters())
        return cls(encoder_params=sum(p.numel() for n, p in named if n.startswith("encoder_layers")),
                   decoder_params=sum(p.numel() for n, p in named if n.startswith("decoder_layers"))
                   + c.vocab_size * c.d_model,
                   attention_width=c.n_heads * (d_k + d_v), n_encoder_layers=c.n_encoder_layers,
                   n_decoder_layers=c.n_decoder_layers, pad_id=c.pad_id)

    def __call__(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Training FLOPs of one batch, src (B, S), tgt (B, T) with bos first: a float64 scalar on their device,
        never read to the host here (no device sync); ``float()`` it when needed."""
        src_len = (src != self.pad_id).sum(1, dtype=torch.float64)  # (B,)
        tgt_len = (tgt[:, 1:] != self.pad_id).sum(1, dtype=torch.float64)  # (B,) target tokens with a loss
        matmuls = 6 * (self.encoder_params * src_len.sum() + self.decoder_params * tgt_len.sum())
        pairs = (self.n_encoder_layers * (src_len ** 2).sum()
                 + self.n_decoder_layers * (tgt_len ** 2 + tgt_len * src_len).sum())
        return matmuls + 6 * self.attention_width * pairs  # per pair: 2 products x 2 x h d forward, x3 with backward


def model_flops(model: nn.Module, batch: dict) -> float:
    """Training FLOPs (forward + backward) of one batch {"src": (B, S), "tgt": (B, T)}: see the module doc."""
    return float(FlopCount.of(model)(batch["src"], batch["tgt"]))


def matmul_shapes(d_model: int, d_ff: int, vocab_size: int, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(m, k, n) of the model's two widest products at ``tokens`` rows: the feed-forward's first layer and the
    output layer."""
    return {"ffn": (tokens, d_model, d_ff), "output": (tokens, d_model, vocab_size)}


def matmul_rate(m: int, k: int, n: int, dtype: torch.dtype = torch.float32, seconds: float = 0.5,
                device: str | torch.device = "cpu") -> float:
    """FLOP/s of (m x k)(k x n) products in ``dtype`` on ``device`` at the current thread count: the median
    time of products repeated for about ``seconds`` (after one warm-up), 2 m k n FLOPs each."""
    a = torch.randn(m, k, device=device).to(dtype)  # random data: zeros can run faster
    b = torch.randn(k, n, device=device).to(dtype)
    cuda = torch.device(device).type == "cuda"
    times = []
    a @ b  # warm-up: allocation, kernel selection
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if len(times) >= 1000:
            break
    return 2 * m * k * n / statistics.median(times)


def matmul_ceiling(d_model: int, d_ff: int, vocab_size: int, tokens: int, dtype: torch.dtype = torch.float32,
                   seconds: float = 1.0, device: str | torch.device = "cpu") -> dict:
    """The matmul rate at the model's shapes (``matmul_shapes``), ``seconds`` in all: {"gflops": {shape: rate},
    "ceiling_gflops": the higher rate, "dtype", "threads", "tokens"}. GFLOP/s = 1e9 FLOP/s."""
    shapes = matmul_shapes(d_model, d_ff, vocab_size, max(int(tokens), 1))
    rates = {name: matmul_rate(*mnk, dtype=dtype, seconds=seconds / len(shapes), device=device) / 1e9
             for name, mnk in shapes.items()}
    return {"gflops": {name: round(rate, 1) for name, rate in rates.items()},
            "ceiling_gflops": round(max(rates.values()), 1), "dtype": str(dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "tokens": max(int(tokens), 1),
            "shapes": {name: list(mnk) for name, mnk in shapes.items()}}
