"""Write notebooks/attention_walkthrough.ipynb and notebooks/attention_maps.ipynb from the cells below,
executed, with their outputs: python scripts/make_notebooks.py (a few seconds on a CPU).

They run in a fresh kernel with one intra-op thread, so that their printed numbers are reproducible;
the maps notebook runs on the tiny random checkpoint of tests/tiny_checkpoint.py (seed 0), which CI can
rebuild. tests/test_notebooks.py executes them the same way and fails when the committed outputs are stale.
"""

import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
TINY_CKPT = "tiny_random.ckpt"  # written by tests/tiny_checkpoint.py into a temporary directory

WALKTHROUGH = [
    ("md", """# Attention, step by step, on our code

This notebook walks through the attention of docs/model.md with `transformer_nmt.model.attention`: the six steps and
their shapes, the causal mask, why scores are divided by sqrt(d_k), and the invariants the tests check.
Everything runs on the CPU in a few seconds."""),
    ("code", """import math
import torch
import matplotlib.pyplot as plt
from transformer_nmt.model.attention import (MultiHeadAttention, blocked_attention, causal_mask,
                                             scaled_dot_product_attention)
torch.manual_seed(0)
%config InlineBackend.figure_formats = ["png"]
plt.rcParams["figure.dpi"] = 80"""),
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
nearly one-hot, and its gradient vanishes; divided by sqrt(d_k), the variance is back to about 1 whatever d_k.
For 200 queries over 10 keys we measure the mean largest softmax weight (0.1 would be uniform, 1 one-hot)
and the mean Frobenius norm of the softmax Jacobian d p / d s = diag(p) - p p^T (the factor every gradient
through the softmax is multiplied by; largest for uniform weights, 0 for one-hot ones)."""),
    ("code", """def softmax_jacobian_norm(scores):
    p = torch.softmax(scores, -1)                                   # (n, keys)
    jacobian = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # (n, keys, keys)
    return torch.linalg.matrix_norm(jacobian).mean()

d_ks = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
rows = []
print(" d_k  var(q.k)  var(q.k/sqrt(d_k))  max weight: raw  scaled   |Jacobian|: raw    scaled")
for d_k in d_ks:
    dots = (torch.randn(10000, d_k) * torch.randn(10000, d_k)).sum(-1)
    scores = (torch.randn(200, 1, d_k) @ torch.randn(200, d_k, 10))[:, 0]  # (200 queries, 10 keys)
    row = dict(raw_peak=torch.softmax(scores, -1).amax(-1).mean().item(),
               scaled_peak=torch.softmax(scores / math.sqrt(d_k), -1).amax(-1).mean().item(),
               raw_grad=softmax_jacobian_norm(scores).item(),
               scaled_grad=softmax_jacobian_norm(scores / math.sqrt(d_k)).item())
    rows.append(row)
    print(f"{d_k:4d}  {dots.var():8.1f}  {(dots / math.sqrt(d_k)).var():18.2f}  {row['raw_peak']:15.2f}  "
          f"{row['scaled_peak']:6.2f}  {row['raw_grad']:15.3f}  {row['scaled_grad']:8.3f}")"""),
    ("code", """fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for key, label, style in (("raw", "q.k (unscaled)", "o-"), ("scaled", "q.k / sqrt(d_k)", "s-")):
    axes[0].plot(d_ks, [r[f"{key}_peak"] for r in rows], style, label=label)
    axes[1].plot(d_ks, [r[f"{key}_grad"] for r in rows], style, label=label)
axes[0].axhline(0.1, color="grey", linestyle=":", label="uniform over 10 keys")
axes[0].set_ylabel("mean max softmax weight")
axes[1].set_ylabel("mean |d softmax / d scores|_F")
for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d_k")
    ax.legend()
fig.suptitle("Unscaled scores saturate the softmax as d_k grows; scaled ones do not")
fig.tight_layout()
plt.show()"""),
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
(online softmax). It equals plain attention; `benchmarks/benchmark_model.py` measures its memory."""),
    ("code", """q, k, v = torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16)
plain, _ = scaled_dot_product_attention(q, k, v, causal_mask(300))
blocked = blocked_attention(q, k, v, causal_mask(300), block_size=64)
error = (blocked - plain).abs().max().item()
print("max |blocked - plain| below 1e-5:", error < 1e-5)  # about 1e-7: float32 rounding, not an approximation
assert torch.allclose(blocked, plain, atol=1e-5)"""),
]

MAPS = [
    ("md", """# Every head of every layer: attention maps of a trained checkpoint

Loads a checkpoint written by `python -m transformer_nmt.train`, then `transformer_nmt.analysis.explore.attention`
translates one sentence with beam search and runs the model once more on (source, translation): it returns
the attention weights of every head (encoder self-attention, decoder self-attention, cross-attention) and
each head's entropy, which this notebook plots. The same data, as an interactive page, comes from
`python -m transformer_nmt.explore ckpt=... "your sentence"`. Set `NMT_CKPT` to choose the checkpoint; by
default the newest `outputs/*/*/checkpoints/last.ckpt`.

**The outputs shown here come from a tiny random model** (1+1 layers, 2 heads, d_model 16,
`tests/tiny_checkpoint.py`), which CI rebuilds to check that they are current: its translation is noise and
its maps show no alignment. Run the notebook on a checkpoint of yours to see a trained model's heads."""),
    ("code", """import os
from pathlib import Path
import matplotlib.pyplot as plt
from transformer_nmt.analysis import explore
from transformer_nmt.checkpoint import load_checkpoint
%config InlineBackend.figure_formats = ["png"]
plt.rcParams["figure.dpi"] = 80

ckpt = os.environ.get("NMT_CKPT") or str(max(Path("..").glob("outputs/*/*/checkpoints/last.ckpt"),
                                              key=os.path.getmtime))
model, tokenizer, meta = load_checkpoint(ckpt)
print("checkpoint:", ckpt, "| step", meta["global_step"], "|", model.num_parameters(), "parameters")
sentence = os.environ.get("NMT_SENTENCE", "A little girl climbing into a wooden playhouse.")
result = explore.attention(model, tokenizer, [sentence], beam=4).sentences[0]
print("source:     ", result.source)
print("translation:", result.translation)"""),
    ("code", """MAX_TOKENS = 32  # longer sentences are cut, so that the labels stay readable
src_tokens, tgt_in_tokens = result.source_pieces[:MAX_TOKENS], result.target_pieces[:MAX_TOKENS]
axes_labels = {"encoder": (src_tokens, src_tokens), "decoder": (tgt_in_tokens, tgt_in_tokens),
               "cross": (tgt_in_tokens, src_tokens)}
for kind, weights in result.weights.items():  # (layers, heads, queries, keys)
    print(kind, "attention:", weights.shape[0], "layers x", tuple(weights.shape[1:]), "(heads, queries, keys)")"""),
    ("code", """def plot_kind(kind):
    weights, entropy = result.weights[kind], result.entropy[kind]  # (layers, h, Lq, Lk), (layers, h)
    n_layers, n_heads = weights.shape[:2]
    rows, cols = axes_labels[kind]
    inches = max(3.0, 0.14 * max(len(rows), len(cols)))  # per map: about 11 pixels per token
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(inches * n_heads, inches * n_layers), squeeze=False)
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            shown = weights[layer, head, :len(rows), :len(cols)]
            ax.imshow(shown.numpy(), cmap="viridis", vmin=0)  # colour: 0 to this map's largest weight
            ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
            ax.set_yticks(range(len(rows)), rows, fontsize=7)
            ax.tick_params(length=0, pad=1)
            ax.set_title(f"layer {layer} head {head}, entropy {entropy[layer, head]:.2f}", fontsize=9)
    fig.suptitle(f"{kind} attention (rows: queries, columns: keys)")
    fig.tight_layout()
    plt.show()

for kind in ("encoder", "decoder", "cross"):
    plot_kind(kind)"""),
    ("md", """Each row of a map sums to 1 over the keys it may see; decoder self-attention is lower-triangular
(causal). Cross-attention heads of a trained model tend to follow the alignment between source and target
words (`python -m transformer_nmt.translate print_alignment=hard` prints it); compare with
`python -m transformer_nmt.analyze_heads`, which measures what each head is worth."""),
]


def build(cells):
    nb = new_notebook()
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"  # stable ids: regenerating changes only what changed
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


NOTEBOOK_CELLS = {"attention_walkthrough.ipynb": WALKTHROUGH, "attention_maps.ipynb": MAPS}


def execute(notebook, checkpoint_dir: Path):
    """Run ``notebook`` in place in a fresh kernel in notebooks/, on one thread, with ``NMT_CKPT`` set to
    the tiny checkpoint in ``checkpoint_dir`` (which the caller writes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NMT_CKPT": str(checkpoint_dir / TINY_CKPT)}
    NotebookClient(notebook, timeout=300, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute(env=env)
    return notebook


def normalise(text: str, checkpoint_dir: Path) -> str:
    """What changes from run to run made constant: the checkpoint's temporary directory, memory addresses."""
    return re.sub(r"0x[0-9a-f]+", "0x...", text.replace(str(checkpoint_dir), "$TMP"))


def text_outputs(notebook, checkpoint_dir: Path) -> list[list[str]]:
    """Per code cell, its printed text and the text form of its results and figures, normalised."""
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        texts = [""]  # stdout, joined: the kernel may send one print in several messages
        for out in cell.outputs:
            if out.output_type == "stream" and out.name == "stdout":
                texts[0] += out.text
            elif out.output_type in ("execute_result", "display_data"):
                texts.append(out.data.get("text/plain", ""))
            elif out.output_type == "error":
                texts.append(f"{out.ename}: {out.evalue}")
        cells.append([normalise(text, checkpoint_dir) for text in texts])
    return cells


def write_tiny_checkpoint(directory: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_checkpoint import tiny_tokenizer, write_checkpoint

    write_checkpoint(directory / TINY_CKPT, tiny_tokenizer())


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_checkpoint(Path(tmp))
        for name, cells in NOTEBOOK_CELLS.items():
            notebook = execute(build(cells), Path(tmp))
            for cell in notebook.cells:
                outputs = []  # consecutive prints joined: the kernel splits them by timing
                for out in cell.get("outputs", []):
                    if out.output_type == "stream":
                        out.text = normalise(out.text, Path(tmp))
                        if outputs and outputs[-1].output_type == "stream" and outputs[-1].name == out.name:
                            outputs[-1].text += out.text
                            continue
                    outputs.append(out)
                if cell.cell_type == "code":
                    cell.outputs = outputs
            nbformat.write(notebook, NOTEBOOKS / name)
            print(f"wrote {NOTEBOOKS / name} ({(NOTEBOOKS / name).stat().st_size / 1e3:.0f} kB)")
