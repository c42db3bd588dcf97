"""Write notebooks/attention_walkthrough.ipynb and notebooks/attention_maps.ipynb from the cells below.
Run: python scripts/make_notebooks.py (the notebooks are committed; tests/test_notebooks.py executes them)."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

WALKTHROUGH = [
    ("md", """# Attention, step by step, on our code

This notebook walks through `ATTENTION_NOTES.md` with `transformer_nmt.attention`: the six steps and
their shapes, the causal mask, why scores are divided by sqrt(d_k), and the invariants the tests check.
Everything runs on the CPU in a few seconds."""),
    ("code", """import math
import torch
import matplotlib.pyplot as plt
from transformer_nmt.attention import (MultiHeadAttention, blocked_attention, causal_mask,
                                       scaled_dot_product_attention)
torch.manual_seed(0)"""),
    ("md", """## 1. The shape table (paper base: d_model 512, h 8, batch 2, 4 tokens)
Project, split heads on the feature axis, scores, weights, weighted sum, merge heads, output projection."""),
    ("code", """mha = MultiHeadAttention(d_model=512, n_heads=8)
x = torch.randn(2, 4, 512)
q = mha.split_heads(mha.q_proj(x)); k = mha.split_heads(mha.k_proj(x)); v = mha.split_heads(mha.v_proj(x))
heads, weights = scaled_dot_product_attention(q, k, v)
merged = mha.merge_heads(heads)
out = mha.out_proj(merged)
for name, t in [("input x", x), ("Q, K, V after split", q), ("scores / weights", weights),
                ("per-head output", heads), ("merged + W_O", out)]:
    print(f"{name:22s} {tuple(t.shape)}")
assert weights.shape == (2, 8, 4, 4) and out.shape == (2, 4, 512)
# The module does the same in one call:
out_module, w_module = mha(x, x, x, need_weights=True)
assert torch.allclose(out_module, out, atol=1e-5) and torch.allclose(w_module, weights, atol=1e-6)"""),
    ("md", """## 2. The causal mask
Position i may attend to positions <= i. The mask is applied to the scores **before** the softmax,
so every row still sums to 1, and row 0 sees only itself."""),
    ("code", """L = 6
mask = causal_mask(L)
q, k, v = torch.randn(1, 1, L, 16), torch.randn(1, 1, L, 16), torch.randn(1, 1, L, 16)
_, w = scaled_dot_product_attention(q, k, v, mask)
fig, axes = plt.subplots(1, 2, figsize=(7, 3))
axes[0].imshow(mask, cmap="Greys"); axes[0].set_title("causal mask (True = may attend)")
axes[1].imshow(w[0, 0].detach(), cmap="viridis"); axes[1].set_title("weights")
plt.show()
print("row sums:", w[0, 0].sum(-1))
print("row 0:", w[0, 0, 0])
assert w[0, 0, 0, 0] == 1 and (w[0, 0].triu(1) == 0).all()"""),
    ("md", """## 3. Why divide by sqrt(d_k)
With q, k ~ N(0, 1), the dot product q.k has variance d_k. Unscaled, the softmax of such scores is
nearly one-hot (its gradient vanishes); divided by sqrt(d_k) the variance is back to about 1."""),
    ("code", """for d_k in (64, 512):
    q, k = torch.randn(10000, d_k), torch.randn(10000, d_k)
    dots = (q * k).sum(-1)
    scaled = dots / math.sqrt(d_k)
    scores = torch.randn(200, 1, d_k) @ torch.randn(200, d_k, 10)  # 200 queries x 10 keys
    peak_raw = torch.softmax(scores, -1).amax(-1).mean()
    peak_scaled = torch.softmax(scores / math.sqrt(d_k), -1).amax(-1).mean()
    print(f"d_k={d_k:4d}: var(q.k)={dots.var():7.1f}  var(q.k/sqrt(d_k))={scaled.var():.2f}  "
          f"mean max softmax weight over 10 keys: raw {peak_raw:.2f}, scaled {peak_scaled:.2f}")"""),
    ("md", """## 4. The invariants
Each is also a test in `tests/test_attention.py`."""),
    ("code", """q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
padding = (torch.arange(7) < torch.tensor([[7], [4]]))[:, None, None, :]  # sample 1 has 4 real keys
out, w = scaled_dot_product_attention(q, k, v, padding)
print("rows sum to 1:", torch.allclose(w.sum(-1), torch.ones(2, 3, 5)))
print("padded keys get exactly 0:", bool((w[1, ..., 4:] == 0).all()))

zero_q = torch.zeros(1, 1, 3, 8)
_, w0 = scaled_dot_product_attention(zero_q, k[1:], v[1:], padding[1:])
print("all-zero scores -> uniform over visible keys:", w0[0, 0, 0])

mha = MultiHeadAttention(16, 4)
x = torch.randn(1, 6, 16); perm = torch.randperm(6)
o, _ = mha(x, x, x); o_perm, _ = mha(x[:, perm], x[:, perm], x[:, perm])
print("permutation equivariance:", torch.allclose(o_perm, o[:, perm], atol=1e-6))

huge = torch.full((1, 1, 2, 4), 100.0)
o_huge, w_huge = scaled_dot_product_attention(huge, huge, torch.randn(1, 1, 2, 4))
print("logits of 2e4 stay finite:", bool(torch.isfinite(o_huge).all()), w_huge[0, 0, 0])

nobody = torch.zeros(1, 1, 1, 7, dtype=torch.bool)
o_empty, w_empty = scaled_dot_product_attention(q[:1], k[:1], v[:1], nobody)
print("a query that sees no key -> zeros, no NaN:", bool((o_empty == 0).all() and (w_empty == 0).all()))"""),
    ("md", """## 5. Long sequences without the n x n matrix
`blocked_attention` walks over key blocks with a running max, a running sum and a running weighted sum
(online softmax). It equals plain attention; `scripts/benchmark_model.py` measures its memory."""),
    ("code", """q, k, v = torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16)
plain, _ = scaled_dot_product_attention(q, k, v, causal_mask(300))
blocked = blocked_attention(q, k, v, causal_mask(300), block_size=64)
print("max |blocked - plain| =", (blocked - plain).abs().max().item())
assert torch.allclose(blocked, plain, atol=1e-5)"""),
]

MAPS = [
    ("md", """# Every head of every layer: attention maps of a trained checkpoint

Loads a checkpoint written by `python -m transformer_nmt.train`, translates one sentence with beam search,
then runs the model once more on (source, translation) and plots the attention weights of every head:
encoder self-attention, decoder self-attention and cross-attention. Set `NMT_CKPT` to choose the
checkpoint; by default the newest `outputs/*/*/checkpoints/last.ckpt`."""),
    ("code", """import os
from pathlib import Path
import matplotlib.pyplot as plt
import torch
from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.translate import translate_lines

ckpt = os.environ.get("NMT_CKPT") or str(max(Path("..").glob("outputs/*/*/checkpoints/last.ckpt"),
                                              key=os.path.getmtime))
model, tokenizer, meta = load_checkpoint(ckpt)
print("checkpoint:", ckpt, "| step", meta["global_step"], "|", model.num_parameters(), "parameters")
sentence = os.environ.get("NMT_SENTENCE", "A little girl climbing into a wooden playhouse.")
translation = translate_lines(model, tokenizer, [sentence], beam=4)[0][0][0]
print("source:     ", sentence)
print("translation:", translation)"""),
    ("code", """src_ids = tokenizer.encode(sentence) + [tokenizer.eos_id]
tgt_ids = [tokenizer.bos_id] + tokenizer.encode(translation) + [tokenizer.eos_id]
src = torch.tensor([src_ids[: model.config.max_positions]])
tgt = torch.tensor([tgt_ids[: model.config.max_positions]])
with torch.no_grad():
    _, attention = model(src, tgt[:, :-1], return_attention=True)
src_tokens = [tokenizer.id_to_piece(i) for i in src[0].tolist()]
tgt_in_tokens = [tokenizer.id_to_piece(i) for i in tgt[0, :-1].tolist()]
axes_labels = {"encoder": (src_tokens, src_tokens), "decoder": (tgt_in_tokens, tgt_in_tokens),
               "cross": (tgt_in_tokens, src_tokens)}
for kind, layers in attention.items():
    print(kind, "attention:", len(layers), "layers x", tuple(layers[0].shape[1:]), "(heads, queries, keys)")"""),
    ("code", """def plot_kind(kind):
    layers = attention[kind]
    n_layers, n_heads = len(layers), layers[0].shape[1]
    rows, cols = axes_labels[kind]
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(2.6 * n_heads, 2.6 * n_layers), squeeze=False)
    for layer, weights in enumerate(layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            ax.imshow(weights[0, head].numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=6)
            ax.set_yticks(range(len(rows)), rows, fontsize=6)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
    fig.suptitle(f"{kind} attention (rows: queries, columns: keys)")
    fig.tight_layout()
    plt.show()

for kind in ("encoder", "decoder", "cross"):
    plot_kind(kind)"""),
    ("md", """Each row of a map sums to 1 over the keys it may see; decoder self-attention is lower-triangular
(causal). Cross-attention heads of a trained model tend to follow the alignment between source and target
words; compare with `python -m transformer_nmt.analyze_heads`, which measures what each head is worth."""),
]


def build(cells):
    nb = new_notebook()
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "notebooks"
    out.mkdir(exist_ok=True)
    for name, cells in (("attention_walkthrough.ipynb", WALKTHROUGH), ("attention_maps.ipynb", MAPS)):
        nbformat.write(build(cells), out / name)
        print("wrote", out / name)
