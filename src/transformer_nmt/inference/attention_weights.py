"""Every head's attention weights on one sentence pair, the decoder teacher-forced: what the attention maps
(training/callbacks.py), word alignment (alignment.py) and the explorer (analysis/explore.py) draw or read.

The model returns its weights when asked (``Transformer.forward(..., return_attention=True)``, which runs the
plain kernel, the only one that forms them); this module turns one pair into that call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_nmt.model.transformer import Transformer


@torch.no_grad()
def teacher_forced_attention(model: Transformer, src: list[int], tgt: list[int], bos_id: int) -> dict[str, Tensor]:
    """``src`` ids (ending in eos), ``tgt`` ids without bos or eos; the decoder's inputs (its queries) are
    bos + ``tgt``. -> {"encoder": (layers, h, S, S), "decoder": (layers, h, T + 1, T + 1), "cross":
    (layers, h, T + 1, S)}, float32 on the CPU."""
    src_t = torch.tensor([src], device=model.device)  # (1, S)
    tgt_in = torch.tensor([[bos_id] + tgt], device=model.device)  # (1, T + 1): query t holds piece t - 1
    _, attention = model(src_t, tgt_in, return_attention=True)  # kind -> per layer (1, h, Lq, Lk)
    return {kind: torch.cat(layers).float().cpu() for kind, layers in attention.items()}  # (layers, h, Lq, Lk)
