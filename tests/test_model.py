"""The whole encoder-decoder against torch.nn.Transformer, incremental decoding, configuration."""

import math

import pytest
import torch
from torch import nn

from transformer_nmt.model import Transformer, TransformerConfig, sinusoidal_positions

PAD = 0


def small_config(**overrides):
    fields = dict(vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=64,
                  dropout=0.0, max_positions=64)
    fields.update(overrides)
    return TransformerConfig(**fields)


def random_batch(vocab=50, B=3, S=7, T=6, generator=None):
    src = torch.randint(4, vocab, (B, S), generator=generator)
    tgt = torch.randint(4, vocab, (B, T), generator=generator)
    src[1, 4:] = PAD  # padded source
    tgt[2, 3:] = PAD  # padded target
    return src, tgt


def copy_attention(ref: nn.MultiheadAttention, ours) -> None:
    ref.in_proj_weight.copy_(ours.in_proj.weight)  # both stack [W_Q; W_K; W_V]
    ref.in_proj_bias.copy_(ours.in_proj.bias)
    ref.out_proj.load_state_dict(ours.out_proj.state_dict())


def torch_reference(model: Transformer) -> nn.Transformer:
    """An nn.Transformer with our weights copied in, layer by layer."""
    cfg = model.config
    ref = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
                         dropout=0.0, batch_first=True, norm_first=cfg.norm_first)
    with torch.no_grad():
        for ours, theirs in zip(model.encoder_layers, ref.encoder.layers):
            copy_attention(theirs.self_attn, ours.self_attn)
            theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
            theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
            theirs.norm1.load_state_dict(ours.attn_block.norm.state_dict())
            theirs.norm2.load_state_dict(ours.ff_block.norm.state_dict())
        for ours, theirs in zip(model.decoder_layers, ref.decoder.layers):
            copy_attention(theirs.self_attn, ours.self_attn)
            copy_attention(theirs.multihead_attn, ours.cross_attn)
            theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
            theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
            theirs.norm1.load_state_dict(ours.self_attn_block.norm.state_dict())
            theirs.norm2.load_state_dict(ours.cross_attn_block.norm.state_dict())
            theirs.norm3.load_state_dict(ours.ff_block.norm.state_dict())
    if cfg.norm_first:
        ref.encoder.norm.load_state_dict(model.encoder_norm.state_dict())
        ref.decoder.norm.load_state_dict(model.decoder_norm.state_dict())
    else:  # nn.Transformer always closes its stacks with a LayerNorm; the post-LN paper model does not
        ref.encoder.norm, ref.decoder.norm = nn.Identity(), nn.Identity()
    return ref


@pytest.mark.parametrize("norm_first", [False, True])
def test_logits_equal_torch_transformer_with_copied_weights(norm_first):
    torch.manual_seed(0)
    model = Transformer(small_config(norm_first=norm_first))
    # Non-trivial LayerNorm parameters, so that a swapped norm would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    ref = torch_reference(model).eval()
    src, tgt = random_batch()
    T = tgt.shape[1]

    logits = model(src, tgt)

    # The reference, fed with our embeddings and projected with our output matrix.
    with torch.enable_grad():  # keep nn.Transformer off its inference fast path (nested tensors)
        src_x = model.src_embed(src) * math.sqrt(32) + model.positions[: src.shape[1]]
        tgt_x = model.tgt_embed(tgt) * math.sqrt(32) + model.positions[:T]
        hidden = ref(src_x, tgt_x, tgt_mask=torch.ones(T, T, dtype=torch.bool).triu(1),
                     src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt == PAD,
                     memory_key_padding_mask=src == PAD, tgt_is_causal=True)
        ref_logits = hidden @ model.src_embed.weight.T
    assert logits.shape == (3, T, 50)
    # At real target positions; pad positions differ (ours lets a pad query see earlier pads: see decode).
    real = tgt != PAD
    torch.testing.assert_close(logits[real], ref_logits[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", ["plain", "blocked", "fused"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_incremental_decoding_equals_full_decoder_at_every_step(kernel, norm_first):
    torch.manual_seed(1)
    model = Transformer(small_config(attention=kernel, attention_block_size=3, norm_first=norm_first)).eval()
    src, _ = random_batch()
    tgt = torch.randint(4, 50, (3, 8))
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache()
        for t in range(tgt.shape[1]):
            step = model.decode(tgt[:, t:t + 1], memory, src, cache=cache)  # (B, 1, V)
            full = model.decode(tgt[:, : t + 1], memory, src)  # (B, t+1, V)
            assert len(cache) == t + 1
            torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)


def test_cache_reorder_follows_the_batch_rows():
    torch.manual_seed(2)
    model = Transformer(small_config()).eval()
    src, _ = random_batch()
    tgt = torch.randint(4, 50, (3, 4))
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache()
        model.decode(tgt[:, :3], memory, src, cache=cache)
        cache.reorder(order)
        step = model.decode(tgt[order, 3:4], memory[order], src[order], cache=cache)
        full = model.decode(tgt[order], memory[order], src[order])
    torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)


def test_cross_attention_keys_are_projected_once_per_source():
    model = Transformer(small_config()).eval()
    src, _ = random_batch()
    cross_attn = model.decoder_layers[0].cross_attn
    calls = []
    project_qkv = cross_attn.project_qkv
    cross_attn.project_qkv = lambda *args: calls.append(1) or project_qkv(*args)
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache()
        for t in range(5):
            model.decode(torch.full((3, 1), 5), memory, src, cache=cache)
    assert len(calls) == 1


def test_padding_does_not_change_the_logits_of_real_tokens():
    torch.manual_seed(3)
    model = Transformer(small_config()).eval()
    src, tgt = torch.randint(4, 50, (1, 5)), torch.randint(4, 50, (1, 4))
    padded_src = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    padded_tgt = torch.cat([tgt, torch.zeros(1, 2, dtype=torch.long)], 1)
    torch.testing.assert_close(model(padded_src, padded_tgt)[:, :4], model(src, tgt), atol=1e-5, rtol=1e-5)


def test_decoder_is_causal():
    torch.manual_seed(4)
    model = Transformer(small_config()).eval()
    src, tgt = random_batch()
    changed = tgt.clone()
    changed[:, 4] = 7
    torch.testing.assert_close(model(src, changed)[:, :4], model(src, tgt)[:, :4])


def test_return_attention_shapes_and_rows():
    model = Transformer(small_config()).eval()
    src, tgt = random_batch()
    logits, attn = model(src, tgt, return_attention=True)
    torch.testing.assert_close(logits, model(src, tgt))
    assert [w.shape for w in attn["encoder"]] == [(3, 4, 7, 7)] * 2
    assert [w.shape for w in attn["decoder"]] == [(3, 4, 6, 6)] * 3
    assert [w.shape for w in attn["cross"]] == [(3, 4, 6, 7)] * 3
    assert (attn["cross"][0][1, :, :, 4:] == 0).all()  # padded source keys get no weight


def test_sinusoidal_positions_follow_the_formula():
    table = sinusoidal_positions(50, 16)
    pos, i = 7, 3
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)


def test_base_model_parameter_count():
    # Paper base at a 37,000 shared vocabulary: 6 + 6 layers of d_model 512, d_ff 2048, tied embeddings.
    d, f, V = 512, 2048, 37000
    attention = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    norm = 2 * d
    expected = V * d + 6 * (attention + ffn + 2 * norm) + 6 * (2 * attention + ffn + 3 * norm)
    assert Transformer(TransformerConfig(vocab_size=V)).num_parameters() == expected == 63_082_496


def test_untied_embeddings_have_their_own_matrices():
    model = Transformer(small_config(tie_embeddings=False))
    assert model.src_embed is not model.tgt_embed
    assert model.num_parameters() == Transformer(small_config()).num_parameters() + 2 * 50 * 32


def test_head_gate_of_zero_changes_output_and_can_be_removed():
    torch.manual_seed(5)
    model = Transformer(small_config()).eval()
    src, tgt = random_batch()
    before = model(src, tgt)
    model.set_head_gates("cross", 1, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert not torch.allclose(model(src, tgt), before)
    model.set_head_gates("cross", 1, None)
    torch.testing.assert_close(model(src, tgt), before)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        model.set_head_gates("encoder", 0, torch.ones(3))


@pytest.mark.parametrize("overrides, message", [
    (dict(d_model=30, n_heads=4), r"model.d_model \(30\) must be divisible by model.n_heads \(4\)"),
    (dict(attention="flash"), "model.attention must be one of"),
    (dict(attention="blocked", attention_dropout=0.1), "blocked"),
])
def test_invalid_configs_are_rejected_with_the_option_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_config(**overrides)


def test_too_long_input_names_max_positions():
    model = Transformer(small_config(max_positions=8))
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.ones(1, 9, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
