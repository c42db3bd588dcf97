"""The architecture switches of issue 38: positions (rotary, none, learned), gated feed-forwards (swiglu, geglu),
RMSNorm. Each computes what its paper says (against formulas written out here), decodes incrementally exactly as
the full forward does, and the rotation stays out of cross-attention."""

import math

import pytest
import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint, read_checkpoint
from transformer_nmt.model.feed_forward import GatedFeedForward, gated_width
from transformer_nmt.model.positions import RotaryPositions
from transformer_nmt.model.transformer import Transformer, TransformerConfig

PAD = 0
OPTIONS = {  # name -> TransformerConfig fields
    "rotary": dict(positions="rotary"),
    "none": dict(positions="none"),
    "learned": dict(positions="learned"),
    "swiglu": dict(activation="swiglu"),
    "geglu": dict(activation="geglu"),
    "rmsnorm": dict(norm="rmsnorm"),
    "modern": dict(norm_first=True, norm="rmsnorm", activation="swiglu", positions="rotary"),
}


def config(**overrides) -> TransformerConfig:
    return TransformerConfig(**{"vocab_size": 50, "d_model": 32, "n_heads": 4, "n_encoder_layers": 2,
                                "n_decoder_layers": 2, "d_ff": 48, "dropout": 0.0, "max_positions": 64,
                                **overrides})


def source_batch(generator=None):
    src = torch.randint(4, 50, (3, 7), generator=generator)
    src[1, 4:] = PAD
    return src


@pytest.mark.parametrize("kernel", ["plain", "fused", "blocked"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_incremental_decoding_equals_the_full_forward(option, kernel):
    """One token at a time through the cache, then three at once after it: each step's logits equal the full
    decoder's on the whole prefix (for rotary: the cached keys were rotated at their own positions)."""
    torch.manual_seed(1)
    model = Transformer(config(**OPTIONS[option], attention=kernel, attention_block_size=3)).eval()
    src, tgt = source_batch(), torch.randint(4, 50, (3, 9))
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache()
        for t in range(6):
            step = model.decode(tgt[:, t:t + 1], memory, src, cache=cache)  # (B, 1, V)
            full = model.decode(tgt[:, :t + 1], memory, src)  # (B, t + 1, V)
            torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)
        several = model.decode(tgt[:, 6:9], memory, src, cache=cache)  # (B, 3, V) after 6 cached
        torch.testing.assert_close(several, model.decode(tgt, memory, src)[:, 6:9], atol=1e-5, rtol=1e-5)
        assert len(cache) == 9


def test_rotary_rotates_pairs_of_halves_as_complex_numbers():
    """RoFormer in complex form: feature pair (i, i + d/2) is z = x_i + j x_(i+d/2), and position m multiplies it
    by exp(j m theta_i), theta_i = 10000^(-2i/d)."""
    d, rotary = 8, RotaryPositions(32, 8)
    x = torch.randn(2, 3, 5, d, dtype=torch.float64)
    out = rotary(x.float(), offset=4).double()
    z = torch.complex(x[..., :d // 2], x[..., d // 2:])  # (2, 3, 5, d/2)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    m = torch.arange(4, 9, dtype=torch.float64)[:, None]  # positions 4..8
    expected = z * torch.polar(torch.ones_like(m * theta), m * theta)
    torch.testing.assert_close(out, torch.cat([expected.real, expected.imag], dim=-1), atol=1e-5, rtol=0)


def test_rotary_scores_depend_on_relative_positions_only():
    rotary = RotaryPositions(64, 16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    scores = [float(rotary(q, m) @ rotary(k, n).transpose(-2, -1)) for m, n in ((3, 1), (10, 8), (40, 38))]
    assert scores[0] == pytest.approx(scores[1], abs=1e-4) == pytest.approx(scores[2], abs=1e-4)
    assert float(rotary(q, 3) @ rotary(k, 0).transpose(-2, -1)) != pytest.approx(scores[0], abs=1e-3)


def test_rotary_is_in_self_attention_only_and_adds_nothing_to_the_embeddings():
    model = Transformer(config(positions="rotary"))
    assert all(layer.self_attn.rotary is model.encoder_layers[0].self_attn.rotary for layer in
               (*model.encoder_layers, *model.decoder_layers))  # one table, shared
    assert all(layer.cross_attn.rotary is None for layer in model.decoder_layers)
    ids = torch.randint(4, 50, (2, 5))
    torch.testing.assert_close(model.embed(ids, model.src_embed), model.src_embed(ids) * math.sqrt(32))
    assert not any(key.startswith("positions") or "rotary" in key for key in model.state_dict())  # nothing saved


@pytest.mark.parametrize("positions, equivariant", [("none", True), ("rotary", False), ("sinusoidal", False)])
def test_without_positions_the_encoder_sees_a_bag_of_tokens(positions, equivariant):
    """positions=none: permuting the source permutes the encoder's output the same way (order is invisible); any
    kind of positions breaks that."""
    torch.manual_seed(2)
    model = Transformer(config(positions=positions)).eval()
    src, order = torch.randint(4, 50, (1, 7)), torch.tensor([3, 0, 6, 1, 5, 2, 4])
    with torch.no_grad():
        memory, permuted = model.encode(src), model.encode(src[:, order])
    assert torch.allclose(permuted, memory[:, order], atol=1e-5) == equivariant


@pytest.mark.parametrize("activation, act", [("swiglu", lambda h: h * torch.sigmoid(h)),
                                             ("geglu", lambda h: 0.5 * h * (1 + torch.erf(h / 2 ** 0.5)))])
def test_gated_feed_forwards_compute_shazeers_formula(activation, act):
    model = Transformer(config(activation=activation, n_encoder_layers=1, n_decoder_layers=1))
    ff = model.encoder_layers[0].feed_forward
    assert isinstance(ff, GatedFeedForward)
    x = torch.randn(3, 4, 32)
    w1, v, w2 = ff.linear1, ff.linear_v, ff.linear2
    expected = (act(x @ w1.weight.T + w1.bias) * (x @ v.weight.T + v.bias)) @ w2.weight.T + w2.bias
    torch.testing.assert_close(ff(x), expected, rtol=0, atol=1e-5)


def test_a_gated_width_of_two_thirds_keeps_the_base_models_parameters():
    """swiglu at d_ff = gated_width(2048) = 1368 against relu at 2048 (the base model, 37k vocabulary): within
    0.2% of the parameters; at d_ff 2048 it would have 50% more feed-forward weights."""
    assert (gated_width(2048), gated_width(1024), gated_width(256)) == (1368, 680, 168)
    with torch.device("meta"):
        plain = Transformer(TransformerConfig(vocab_size=37000)).num_parameters()
        gated = Transformer(TransformerConfig(vocab_size=37000, activation="swiglu", d_ff=1368)).num_parameters()
        wide = Transformer(TransformerConfig(vocab_size=37000, activation="swiglu")).num_parameters()
    assert abs(gated - plain) / plain < 0.002
    assert wide - plain == 12 * (512 * 2048 + 2048)  # one more d_model x d_ff matrix and bias per layer


def test_rmsnorm_normalises_by_the_root_mean_square_without_centring():
    model = Transformer(config(norm="rmsnorm", norm_first=True))
    norm = model.encoder_layers[0].attn_block.norm
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 32))
    x = torch.randn(2, 3, 32) + 3.0  # off-centre: LayerNorm would remove the mean, RMSNorm does not
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected, rtol=0, atol=1e-5)
    assert "bias" not in dict(norm.named_parameters())
    assert type(model.encoder_norm).__name__ == "RMSNorm"  # pre-norm's final norm is the same kind


@pytest.mark.parametrize("overrides, message", [
    (dict(norm="batchnorm"), r"model.norm must be one of \('layernorm', 'rmsnorm'\), got 'batchnorm'"),
    (dict(activation="reglu"), r"model.activation must be one of \('relu', 'swish', 'gelu', 'swiglu', 'geglu'\)"),
    (dict(positions="rotary", d_k=7), r"model.positions=rotary .* d_k must be even, got 7"),
])
def test_a_setting_the_model_cannot_build_is_refused_naming_the_option(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_a_learned_position_table_saved_before_positions_were_modules_loads(tmp_path):
    """Older checkpoints hold a learned table as ``model.positions``; it loads as ``model.positions.weight``."""
    tokenizer = tiny_tokenizer()
    model = write_checkpoint(tmp_path / "new.ckpt", tokenizer, positions="learned").eval()
    checkpoint = torch.load(tmp_path / "new.ckpt", weights_only=True)
    checkpoint["state_dict"]["model.positions"] = checkpoint["state_dict"].pop("model.positions.weight")
    torch.save(checkpoint, tmp_path / "old.ckpt")
    assert "model.positions.weight" in read_checkpoint(tmp_path / "old.ckpt")["state_dict"]
    loaded, _, _ = load_checkpoint(tmp_path / "old.ckpt")
    src, tgt = torch.randint(4, 50, (2, 6)), torch.randint(4, 50, (2, 5))
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), atol=0, rtol=0)
