"""Per-head attention maps as numbers and pictures: each head's entropy, and heatmap PNGs over a sentence's
tokens (TensorBoard's maps in training/callbacks.py, the explorer's statistics in analysis/explore.py)."""

from __future__ import annotations

import io

import numpy as np
import PIL.Image
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

ATTENTION_KINDS = {"encoder": "encoder-self", "decoder": "decoder-self", "cross": "cross"}  # model key -> tag


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention distributions. weights (B, h, Lq, Lk) -> (h,)."""
    p = weights.float()
    per_query = -(p * torch.log(p.clamp_min(1e-12))).sum(dim=-1)  # (B, h, Lq)
    return per_query.mean(dim=(0, 2))  # (h,)


def render_heatmaps(maps: np.ndarray, keys: list[str], queries: list[str], titles: list[str],
                    inches: float = 6.0, dpi: int = 80, fontsize: float = 10.0) -> list[bytes]:
    """Maps (n, Lq, Lk) over one probe's tokens (keys on x, queries on y): one PNG each, ``inches * dpi``
    pixels square whatever the sentence lengths, so that TensorBoard shows every map of a tag at one size.

    The axes and token labels are drawn once; each map then redraws only its image and title. Labels
    shrink below ``fontsize`` only when a long sentence needs it.
    """
    fig = Figure(figsize=(inches, inches), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    left, bottom, top = 0.2, 0.2, 0.93
    ax = fig.add_axes((left, bottom, 0.99 - left, top - bottom))
    image = ax.imshow(maps[0], cmap="viridis", interpolation="nearest", aspect="auto", animated=True)
    title = fig.suptitle("", fontsize=fontsize, animated=True)  # animated: left out of canvas.draw()
    points_per_token = (top - bottom) * inches * 72 / max(len(keys), len(queries))  # 72 points per inch
    size = min(fontsize, 0.9 * points_per_token)
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=size)
    ax.set_yticks(range(len(queries)), queries, fontsize=size)
    ax.tick_params(length=0, pad=1)
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    pngs = []
    for weights, text in zip(maps, titles):
        canvas.restore_region(background)
        image.set_data(weights)
        image.set_clim(0.0, max(float(weights.max()), 1e-6))  # 0 to the largest weight: diffuse heads stay readable
        title.set_text(text)
        ax.draw_artist(image)
        fig.draw_artist(title)
        buffer = io.BytesIO()
        PIL.Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3]).save(buffer, format="png")
        pngs.append(buffer.getvalue())
    return pngs
