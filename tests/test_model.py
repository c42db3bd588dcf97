"""The whole encoder-decoder against torch.nn.Transformer, incremental decoding, configuration."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_nmt.analysis.head_gates import attention_modules, fold_gates, gates, set_gates, set_layer_gates
from transformer_nmt.checkpoint import migrate_checkpoint
from transformer_nmt.inference.attention_weights import teacher_forced_attention
from transformer_nmt.model.attention import causal_mask
from transformer_nmt.model.positions import sinusoidal_positions
from transformer_nmt.model.transformer import Transformer, TransformerConfig

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
        src_x = model.src_embed(src) * math.sqrt(32) + model.positions.table[: src.shape[1]]
        tgt_x = model.tgt_embed(tgt) * math.sqrt(32) + model.positions.table[:T]
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


def right_padded_batch(generator):
    """src (3, 7), tgt (3, 9) right-padded, as every batch is: targets of 9, 5 and 2 tokens."""
    src, _ = random_batch(generator=generator)
    tgt = torch.randint(4, 50, (3, 9), generator=generator)
    tgt[1, 5:] = PAD
    tgt[2, 2:] = PAD
    return src, tgt


def loss_and_gradients(model, logits, labels):
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD, label_smoothing=0.1)
    return [loss, *torch.autograd.grad(loss, list(model.parameters()))]


@pytest.mark.parametrize("kernel", ["plain", "fused", "blocked"])
def test_causal_decoder_without_padding_mask_equals_explicit_masks(kernel):
    # Training runs the decoder self-attention with is_causal and no mask. On right-padded targets a real
    # query only sees real keys and pad rows carry no loss, so loss and every gradient equal those of the
    # explicit (B, 1, T, T) causal-and-padding mask, fed here layer by layer.
    torch.manual_seed(6)
    model = Transformer(small_config(attention=kernel, attention_block_size=4)).train()  # dropout 0
    src, tgt = right_padded_batch(torch.Generator().manual_seed(6))
    tgt_in, labels = tgt[:, :-1], tgt[:, 1:]
    ours = loss_and_gradients(model, model(src, tgt_in), labels)

    memory = model.encode(src)
    explicit = causal_mask(tgt_in.shape[1]) & model.padding_mask(tgt_in)  # (B, 1, T, T)
    x = model.embed(tgt_in, model.tgt_embed)
    for layer in model.decoder_layers:
        x, _, _ = layer(x, memory, model.padding_mask(src), self_mask=explicit)
    reference = loss_and_gradients(model, model.project(model.decoder_norm(x)), labels)
    for got, expected in zip(ours, reference):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_sdpa_receives_no_mask_for_causal_self_attention_and_key_masks_elsewhere(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append(dict(lq=q.shape[-2], lk=k.shape[-2], is_causal=is_causal,
                          mask=None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    torch.manual_seed(7)
    model = Transformer(small_config(attention="auto"))  # auto runs the fused kernel (SDPA) where no weights are asked
    src, tgt = right_padded_batch(torch.Generator().manual_seed(7))
    B, S, T = src.shape[0], src.shape[1], tgt.shape[1]
    key_mask = dict(is_causal=False, mask=((B, 1, 1, S), torch.bool))
    encoder = dict(lq=S, lk=S, **key_mask)
    decoder_self = dict(lq=T, lk=T, is_causal=True, mask=None)  # Flash-eligible: no mask at all
    cross = dict(lq=T, lk=S, **key_mask)

    model.train()(src, tgt).sum().backward()  # training
    assert calls == [encoder] * 2 + [decoder_self, cross] * 3
    calls.clear()
    with torch.no_grad():
        model.eval()(src, tgt)  # validation loss: the same calls
        assert calls == [encoder] * 2 + [decoder_self, cross] * 3
        calls.clear()
        memory, cache = model.encode(src), model.new_cache()
        model.decode(tgt[:, :1], memory, src, cache=cache)  # first step: 1 query, 1 key
        model.decode(tgt[:, 1:2], memory, src, cache=cache)  # later steps: 1 query sees every cached key
        model.decode(tgt[:, 2:4], memory, src, cache=cache)  # 2 steps at once: an explicit (2, 4) mask

    def step(lq, lk, **self_attn):  # one decoder pass: per layer, self-attention then cross-attention
        return [dict(lq=lq, lk=lk, **self_attn), dict(lq=lq, lk=S, **key_mask)] * 3

    assert calls == ([encoder] * 2 + step(1, 1, is_causal=True, mask=None) + step(1, 2, is_causal=False, mask=None)
                     + step(2, 4, is_causal=False, mask=((2, 4), torch.bool)))
    calls.clear()
    with torch.no_grad():
        model(src, tgt, return_attention=True)  # weights: the hand-written kernel, never SDPA
        Transformer(small_config(attention="plain"))(src, tgt)
    assert calls == []


def test_old_checkpoints_with_separate_q_k_v_projections_load():
    torch.manual_seed(8)
    model = Transformer(small_config()).eval()
    old = {}  # the state_dict layout before in_proj: q_proj, k_proj, v_proj per attention module
    for key, value in model.state_dict().items():
        if ".in_proj." in key:
            for name, part in zip("qkv", value.chunk(3)):
                old[key.replace(".in_proj.", f".{name}_proj.")] = part.clone()
        else:
            old[key] = value
    assert not any(".in_proj." in key for key in old) and any(".q_proj.weight" in key for key in old)
    loaded = Transformer(small_config()).eval()
    loaded.load_state_dict(migrate_checkpoint({"state_dict": old}, "old")["state_dict"])  # strict
    src, tgt = random_batch()
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), atol=0, rtol=0)


def test_buffers_are_not_saved_so_ddp_need_not_broadcast_them():
    # The only buffer is the sinusoidal table, a function of the config, not saved in the state_dict:
    # DDP can run with broadcast_buffers=False (no per-step broadcast) without ranks drifting apart.
    model = Transformer(small_config())
    assert [name for name, _ in model.named_buffers()] == ["positions.table"]
    assert not any(key.startswith("positions") for key in model.state_dict())
    torch.testing.assert_close(model.positions.table, sinusoidal_positions(64, 32), atol=0, rtol=0)


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
    cross_attn.project_qkv = lambda *args: calls.append(1) or project_qkv(*args)  # projects K and V
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


def test_teacher_forced_attention_holds_every_layer_of_one_pair_with_bos_first():
    """What explore, alignment and AttentionMaps read: per kind (layers, h, queries, keys), the decoder's queries
    bos + target. Query t sees pieces < t only, so changing the last piece leaves the earlier rows alone."""
    torch.manual_seed(5)
    model = Transformer(small_config()).eval()
    src, tgt, bos = [9, 10, 11, 12, 3], [20, 21, 22], 2
    maps = teacher_forced_attention(model, src, tgt, bos)
    assert {kind: tuple(w.shape) for kind, w in maps.items()} == {
        "encoder": (2, 4, 5, 5), "decoder": (3, 4, 4, 4), "cross": (3, 4, 4, 5)}
    assert all(w.dtype == torch.float32 and w.device.type == "cpu" for w in maps.values())
    torch.testing.assert_close(maps["cross"].sum(-1), torch.ones(3, 4, 4))
    _, attn = model(torch.tensor([src]), torch.tensor([[bos] + tgt]), return_attention=True)
    torch.testing.assert_close(maps["cross"][1], attn["cross"][1][0])  # layer 1 is the model's layer 1
    changed = teacher_forced_attention(model, src, tgt[:-1] + [30], bos)
    for kind in ("decoder", "cross"):
        torch.testing.assert_close(changed[kind][:, :, :3], maps[kind][:, :, :3])
        assert not torch.allclose(changed[kind][:, :, 3], maps[kind][:, :, 3])


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
    cross_1 = attention_modules(model, "cross")[1]
    set_layer_gates(cross_1, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    gated = model(src, tgt)
    assert not torch.allclose(gated, before)
    assert gates(model)["cross"].tolist()[1] == [1.0, 0.0, 1.0, 1.0] and gates(model)["encoder"].eq(1).all()
    set_layer_gates(cross_1, None)
    torch.testing.assert_close(model(src, tgt), before, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        set_layer_gates(attention_modules(model, "encoder")[0], torch.ones(3))
    # Silencing a head = zeroing its d_v input columns of W_O (the independent reference), and fold_gates
    # makes that permanent: the same logits with no hook left.
    reference = Transformer(small_config()).eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        reference.decoder_layers[1].cross_attn.out_proj.weight[:, 8:16] = 0  # head 1 of 4, d_v 8
    set_gates(model, {("cross", 1, 1)})
    torch.testing.assert_close(model(src, tgt), reference(src, tgt), atol=1e-6, rtol=1e-6)
    copied = copy.deepcopy(model)  # the gates live in the module's hooks: a copy keeps them, and they fold there
    assert gates(copied)["cross"][1].tolist() == [1.0, 0.0, 1.0, 1.0]
    torch.testing.assert_close(copied.double()(src, tgt), reference.double()(src, tgt).float().double(),
                               atol=1e-5, rtol=1e-5)  # another dtype: the gate follows the heads'
    reference.float()
    fold_gates(model)
    assert gates(model)["cross"].eq(1).all() and not cross_1.out_proj._forward_pre_hooks
    torch.testing.assert_close(model(src, tgt), reference(src, tgt), atol=1e-6, rtol=1e-6)


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


# --- Table 3 rows (B) and (E): d_k apart from d_model / h, learned positions ------------------------

@pytest.mark.parametrize("kernel", ["plain", "blocked", "fused"])
def test_d_k_apart_and_learned_positions_train_and_decode_under_every_kernel(kernel):
    from transformer_nmt.generation.search import greedy_decode

    torch.manual_seed(3)
    shape = dict(d_k=6, d_v=10, positions="learned", n_encoder_layers=1, n_decoder_layers=2)
    model = Transformer(small_config(**shape, attention=kernel, attention_block_size=3))
    assert isinstance(model.positions.weight, nn.Parameter) and model.positions.weight.shape == (64, 32)
    plain = Transformer(small_config(**shape, attention="plain"))
    plain.load_state_dict(model.state_dict())  # strict: the learned table is saved
    src, tgt = random_batch()
    torch.testing.assert_close(model(src, tgt), plain(src, tgt), atol=1e-5, rtol=1e-5)

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):  # training steps: the table learns the rows of the positions it saw, and only those
        loss = F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        grad = model.positions.weight.grad
        assert grad[:7].abs().sum() > 0 and (grad[7:] == 0).all()
        optimizer.step()

    model.eval()
    with torch.no_grad():  # greedy decoding with the cache equals arg-max over the whole prefix, step by step
        hypotheses = greedy_decode(model, src, bos_id=2, eos_id=3, max_len_offset=2)
        memory, prefix = model.encode(src), torch.full((3, 1), 2)
        for _ in range(max(map(len, hypotheses)) + 1):
            logits = model.decode(prefix, memory, src)[:, -1]
            logits[:, [PAD, 2]] = float("-inf")  # greedy_decode never emits pad or bos
            prefix = torch.cat([prefix, logits.argmax(-1, keepdim=True)], dim=1)
    for row, hypothesis in enumerate(hypotheses):
        assert prefix[row, 1:len(hypothesis) + 1].tolist() == hypothesis


def test_checkpoints_from_before_d_k_and_positions_load():
    """A config dict without d_k, d_v and positions (written before them) builds the same model: sinusoids,
    d_k = d_v = d_model / h, the same parameter shapes; the sinusoid table is still not saved."""
    torch.manual_seed(4)
    model = Transformer(small_config()).eval()
    old_config = {k: v for k, v in model.config.to_dict().items() if k not in ("d_k", "d_v", "positions")}
    loaded = Transformer(TransformerConfig(**old_config)).eval()
    loaded.load_state_dict(model.state_dict())  # strict
    assert loaded.config.head_dims() == (8, 8) and loaded.config.positions == "sinusoidal"
    src, tgt = random_batch()
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), atol=0, rtol=0)
    assert not any(key.startswith("positions") for key in model.state_dict())
    assert "positions.weight" in Transformer(small_config(positions="learned")).state_dict()


def test_unknown_positions_are_rejected_with_the_option_named():
    expected = r"model.positions must be one of \('sinusoidal', 'learned', 'rotary', 'none'\)"
    with pytest.raises(ValueError, match=expected):
        small_config(positions="alibi")
