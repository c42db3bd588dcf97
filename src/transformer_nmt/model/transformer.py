"""The encoder-decoder Transformer of "Attention Is All You Need" (section 3), in one page.

Data flows: token ids -> shared embedding * sqrt(d_model) (+ absolute positions; 3.4, 3.5) -> N encoder layers
(self-attention, feed-forward; 3.1, 3.3) -> memory; target ids shifted right -> N decoder layers (causal
self-attention, cross-attention over memory, feed-forward) -> linear map onto the vocabulary, with the weights
shared with the embedding (3.4).

Every sub-layer is wrapped as Norm(x + Dropout(sublayer(x))) (post-norm, the paper), or
x + Dropout(sublayer(Norm(x))) with a final Norm per stack (pre-norm, ``norm_first=True``).

The parts a study swaps are modules chosen by name, each in its own file: positions (positions.py: sinusoidal,
learned, rotary, none), the feed-forward (feed_forward.py: relu, gelu, swish, swiglu, geglu), the norm
(norms.py: layernorm, rmsnorm), the attention kernel (attention.py). Each module initialises its own weights
(``init_weights``). This module is plain PyTorch: it knows nothing of Lightning.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_nmt.model.attention import AttentionCache, MultiHeadAttention, causal_mask, check_attention, head_dims
from transformer_nmt.model.dropout import Dropout
from transformer_nmt.model.feed_forward import ACTIVATIONS, feed_forward
from transformer_nmt.model.norms import NORMS, norm
from transformer_nmt.model.positions import POSITION_SCHEMES, absolute_positions, rotary_positions
from transformer_nmt.options import Role, declares_roles, option

TRAINING, MAY_CHANGE = Role.TRAINING, Role.MAY_CHANGE


@declares_roles
@dataclass
class TransformerConfig:
    """Hyper-parameters, named as in the paper's Table 3 (defaults: the base model). Each field's metadata holds
    its help, its role in a training run (options.Role: the kernel may change on resume, the rest defines
    training) and, as ``run_setting``, whether a fine-tune (``init_from``) takes it from the command rather than
    from the checkpoint's architecture."""

    vocab_size: int = field(metadata={"help": "set from the tokenizer at run time (data.vocab_size)", "role": TRAINING})
    d_model: int = option(512, "model width", role=TRAINING)
    n_heads: int = option(8, "attention heads h", role=TRAINING)
    d_k: int | None = option(None, "queries and keys per head; null: d_model / n_heads (Table 3, row B sets it apart)",
                             role=TRAINING)
    d_v: int | None = option(None, "values per head; null: d_model / n_heads", role=TRAINING)
    n_encoder_layers: int = option(6, "encoder layers N", role=TRAINING)
    n_decoder_layers: int = option(6, "decoder layers N", role=TRAINING)
    d_ff: int = option(2048, "inner size of the feed-forward sub-layers", role=TRAINING)
    dropout: float = option(0.1, "P_drop: sub-layer outputs and embedding sums (5.4)", role=TRAINING, run_setting=True)
    attention_dropout: float = option(0.0, "on attention weights; the paper has none", role=TRAINING, run_setting=True)
    activation_dropout: float = option(0.0, "inside the feed-forward, after the non-linearity (fairseq's "
                                            "activation_dropout); the paper has none", role=TRAINING)
    max_positions: int = option(1024, "longest sequence the position table holds", role=TRAINING)
    positions: str = option("sinusoidal", "sinusoidal (3.5) | learned: a trained (max_positions, d_model) table "
                                          "(row E) | rotary: self-attention's queries and keys rotated by position "
                                          "(RoFormer) | none", role=TRAINING)
    norm_first: bool = option(False, "false: post-norm as in the paper; true: pre-norm", role=TRAINING)
    norm: str = option("layernorm", "layernorm (the paper) | rmsnorm (Zhang & Sennrich 2019: no centring, no bias)",
                       role=TRAINING)
    tie_embeddings: bool = option(True, "one matrix for source, target and output embeddings (3.4)", role=TRAINING)
    activation: str = option("relu", "the feed-forward: relu (3.3) | swish (x sigmoid(x), opus-mt's) | gelu (erf "
                                     "form) | swiglu, geglu: gated, three matrices (at equal parameters d_ff is 2/3 "
                                     "of a plain one's: feed_forward.gated_width)", role=TRAINING)
    output_bias: bool = option(False, "a bias on the output logits (the paper has none; MarianMT's "
                                      "final_logits_bias)", role=TRAINING)
    pad_id: int = option(0, "must be 0, the tokenizer's pad id", role=TRAINING)
    attention: str = option("auto", "auto (plain for weights, else the faster: attention.choose_kernel) | plain | "
                                    "blocked | fused", role=MAY_CHANGE, run_setting=True)
    attention_block_size: int = option(128, "keys per block of the blocked kernel", role=MAY_CHANGE,
                                       run_setting=True)

    def __post_init__(self):
        check_attention(self.d_model, self.n_heads, self.attention, prefix="model.", d_k=self.d_k, d_v=self.d_v)
        for key, registry in (("positions", POSITION_SCHEMES), ("activation", ACTIVATIONS), ("norm", NORMS)):
            if getattr(self, key) not in registry:
                raise ValueError(f"model.{key} must be one of {tuple(registry)}, got {getattr(self, key)!r}")
        if POSITION_SCHEMES[self.positions].rotary and self.head_dims()[0] % 2:
            raise ValueError(f"model.positions={self.positions} rotates pairs of query/key features: d_k must be "
                             f"even, got {self.head_dims()[0]}")
        if self.attention == "blocked" and self.attention_dropout > 0:
            raise ValueError("model.attention=blocked does not support model.attention_dropout > 0")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"model.pad_id ({self.pad_id}) must be inside the vocabulary (size {self.vocab_size})")
        for name in ("vocab_size", "d_ff", "max_positions", "n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)

    def head_dims(self) -> tuple[int, int]:
        """(d_k, d_v) of every head, defaults resolved."""
        return head_dims(self.d_model, self.n_heads, self.d_k, self.d_v)


class SublayerConnection(nn.Module):
    """Residual connection around a sub-layer, with dropout and a norm (``model.norm``; 3.1, 5.4)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, norm_kind: str = "layernorm"):
        super().__init__()
        self.norm = norm(norm_kind, d_model)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> tuple[Tensor, Tensor | None]:
        """``sublayer`` maps a (B, L, d_model) tensor to (output, attention weights or None)."""
        if self.norm_first:
            out, weights = sublayer(self.norm(x))
            return x + self.dropout(out), weights
        out, weights = sublayer(x)
        return self.norm(x + self.dropout(out)), weights


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, rotary: nn.Module | None = None):
        super().__init__()
        self.self_attn = _attention(cfg, rotary)
        self.feed_forward = feed_forward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.attn_block = SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.norm)
        self.ff_block = SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.norm)

    def init_weights(self) -> None:
        self.self_attn.init_weights()
        self.feed_forward.init_weights()

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, S, d_model), mask (B, 1, 1, S): every query sees every real key."""
        x, weights = self.attn_block(x, lambda h: self.self_attn(h, h, h, mask, need_weights=need_weights))
        x, _ = self.ff_block(x, lambda h: (self.feed_forward(h), None))
        return x, weights  # (B, S, d_model), (B, h, S, S) or None


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, rotary: nn.Module | None = None):
        super().__init__()
        self.self_attn = _attention(cfg, rotary)
        self.cross_attn = _attention(cfg)  # source and target positions are unrelated: never rotary
        self.feed_forward = feed_forward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.self_attn_block = SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.norm)
        self.cross_attn_block = SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.norm)
        self.ff_block = SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.norm)

    def init_weights(self) -> None:
        self.self_attn.init_weights()
        self.cross_attn.init_weights()
        self.feed_forward.init_weights()

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor, self_mask: Tensor | None = None,
                is_causal: bool = False, cache: LayerCache | None = None, need_weights: bool = False):
        """x (B, T, d_model), memory (B, S, d_model), memory_mask (B, 1, 1, S); the self-attention sees
        what ``self_mask`` (T, t) and ``is_causal`` allow (Transformer.decode chooses them)."""
        self_cache, cross_cache = (cache.self_attn, cache.cross_attn) if cache is not None else (None, None)
        x, self_weights = self.self_attn_block(x, lambda h: self.self_attn(
            h, h, h, self_mask, is_causal, need_weights=need_weights, cache=self_cache))
        x, cross_weights = self.cross_attn_block(x, lambda h: self.cross_attn(
            h, memory, memory, memory_mask, need_weights=need_weights, cache=cross_cache))
        x, _ = self.ff_block(x, lambda h: (self.feed_forward(h), None))
        return x, self_weights, cross_weights


def _attention(cfg: TransformerConfig, rotary: nn.Module | None = None) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, kernel=cfg.attention,
                              block_size=cfg.attention_block_size, d_k=cfg.d_k, d_v=cfg.d_v, rotary=rotary)


class LayerCache:
    """Incremental-decoding state of one decoder layer."""

    def __init__(self):
        self.self_attn = AttentionCache(static=False)
        self.cross_attn = AttentionCache(static=True)


class DecoderCache:
    """Incremental-decoding state of the whole decoder: one LayerCache per layer."""

    def __init__(self, n_layers: int):
        self.layers = [LayerCache() for _ in range(n_layers)]

    def __len__(self) -> int:
        """Number of target positions already decoded."""
        return len(self.layers[0].self_attn)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` in every layer (beam search)."""
        for layer in self.layers:
            layer.self_attn.reorder(index)
            layer.cross_attn.reorder(index)


class Transformer(nn.Module):
    """Encoder-decoder Transformer. ``forward(src (B, S), tgt_in (B, T)) -> logits (B, T, vocab)``."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = cfg = config
        self.embed_scale = math.sqrt(cfg.d_model)
        self.src_embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.tie_embeddings else nn.Embedding(
            cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        # Added to the embeddings (sinusoidal, learned), or nothing (rotary, none): (B, L, d_model) -> same
        self.positions = absolute_positions(cfg.positions, cfg.max_positions, cfg.d_model)
        # rotary: one rotation of queries and keys (B, h, L, d_k), shared by every self-attention; else None
        rotary = rotary_positions(cfg.positions, cfg.max_positions, cfg.head_dims()[0])
        self.embed_dropout = Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, rotary) for _ in range(cfg.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, rotary) for _ in range(cfg.n_decoder_layers))
        # Pre-norm leaves the residual stream un-normalised: close each stack with a norm.
        self.encoder_norm = norm(cfg.norm, cfg.d_model) if cfg.norm_first else nn.Identity()
        self.decoder_norm = norm(cfg.norm, cfg.d_model) if cfg.norm_first else nn.Identity()
        self.output_proj = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # (vocab,) added to the logits; starts at 0. None: no bias (the paper; checkpoints before it)
        self.output_bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.output_bias else None
        self.init_weights()

    def init_weights(self) -> None:
        """Each layer's matrices Xavier-uniform and biases 0 (in module order), norms at gamma 1 and beta 0, then
        the embeddings N(0, d^-1/2) with pad's row 0, then a learned position table as the embeddings."""
        for layer in (*self.encoder_layers, *self.decoder_layers):
            layer.init_weights()
        if self.output_proj is not None:
            nn.init.xavier_uniform_(self.output_proj.weight)
        if self.output_bias is not None:
            nn.init.zeros_(self.output_bias)
        for embed in dict.fromkeys([self.src_embed, self.tgt_embed]):  # once each, in a fixed order
            # Shared with the output layer: N(0, d^-1/2) keeps logits O(1) (as in tensor2tensor).
            nn.init.normal_(embed.weight, mean=0.0, std=self.config.d_model ** -0.5)
            with torch.no_grad():
                embed.weight[self.config.pad_id].zero_()
        if hasattr(self.positions, "init_weights"):  # a learned table
            self.positions.init_weights()

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return self.src_embed.weight.device

    def num_parameters(self, trainable_only: bool = True) -> int:
        """Number of distinct parameters (shared embeddings counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    # --- masks -----------------------------------------------------------------------------
    def padding_mask(self, ids: Tensor) -> Tensor:
        """(B, L) ids -> (B, 1, 1, L) bool, True at real tokens: broadcasts over heads and queries."""
        return (ids != self.config.pad_id)[:, None, None, :]

    def embed(self, ids: Tensor, embedding: nn.Embedding, offset: int = 0) -> Tensor:
        length = ids.shape[1]
        if offset + length > self.config.max_positions:
            raise ValueError(f"sequence of {offset + length} tokens is longer than model.max_positions "
                             f"({self.config.max_positions})")
        x = self.positions(embedding(ids) * self.embed_scale, offset)  # (B, L, d_model)
        return self.embed_dropout(x)

    # --- encoder / decoder -----------------------------------------------------------------
    def encode(self, src: Tensor, need_weights: bool = False):
        """src (B, S) -> memory (B, S, d_model); with ``need_weights`` also [per layer (B, h, S, S)]."""
        mask = self.padding_mask(src)  # (B, 1, 1, S)
        x = self.embed(src, self.src_embed)
        all_weights = []
        for layer in self.encoder_layers:
            x, weights = layer(x, mask, need_weights)
            all_weights.append(weights)
        memory = self.encoder_norm(x)
        return (memory, all_weights) if need_weights else memory

    def decode(self, tgt_in: Tensor, memory: Tensor, src: Tensor, cache: DecoderCache | None = None,
               need_weights: bool = False):
        """tgt_in (B, T) -> logits (B, T, vocab).

        ``src`` (B, S) gives the source padding mask. With a ``cache`` (from ``new_cache()``),
        ``tgt_in`` holds only the tokens not yet decoded (usually one, (B, 1)); keys and values
        of earlier steps come from the cache, so step t costs O(t).

        ``tgt_in`` is right-padded (as every batch is): the self-attention is causal only, with no
        padding mask. A real query i sees keys <= i, all real; a pad query also sees pads, and its
        output is ignored (no loss, and no real query attends to it). The logits of real tokens
        equal those of an explicit causal-and-padding mask (tests/test_model.py proves it).
        """
        offset = len(cache) if cache is not None else 0
        T = tgt_in.shape[1]
        # Section 3.2.3: position i attends to positions <= i.
        if offset == 0:  # the whole prefix at once (training): causal, no mask built
            self_mask, is_causal = None, True
        elif T == 1:  # one new step after the cache: it may see every key so far
            self_mask, is_causal = None, False
        else:  # several new steps after the cache: new row i sees keys <= offset + i
            self_mask, is_causal = causal_mask(offset + T, tgt_in.device)[offset:], False  # (T, offset+T)
        memory_mask = self.padding_mask(src)  # (B, 1, 1, S)
        x = self.embed(tgt_in, self.tgt_embed, offset)
        self_weights, cross_weights = [], []
        for i, layer in enumerate(self.decoder_layers):
            layer_cache = cache.layers[i] if cache is not None else None
            x, w_self, w_cross = layer(x, memory, memory_mask, self_mask, is_causal, layer_cache, need_weights)
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        logits = self.project(self.decoder_norm(x))
        return (logits, self_weights, cross_weights) if need_weights else logits

    def project(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, vocab); shares the embedding matrix when tied; adds ``output_bias`` (vocab,)."""
        weight = self.tgt_embed.weight if self.output_proj is None else self.output_proj.weight  # (vocab, d_model)
        return F.linear(x, weight, self.output_bias)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(len(self.decoder_layers))

    def forward(self, src: Tensor, tgt_in: Tensor, return_attention: bool = False):
        """src (B, S), tgt_in (B, T) -> logits (B, T, vocab); with ``return_attention`` also
        {"encoder": [(B, h, S, S)], "decoder": [(B, h, T, T)], "cross": [(B, h, T, S)]}, one per layer."""
        if not return_attention:
            return self.decode(tgt_in, self.encode(src), src)
        memory, enc_weights = self.encode(src, need_weights=True)
        logits, dec_weights, cross_weights = self.decode(tgt_in, memory, src, need_weights=True)
        return logits, {"encoder": enc_weights, "decoder": dec_weights, "cross": cross_weights}
