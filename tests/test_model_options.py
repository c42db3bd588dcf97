"""model.activation and model.output_bias (what MarianMT imports need): the defaults are the paper's network, as
checkpoints written before the options hold it; the options compute what they say. And the split tokenizer
(separate source and target SentencePiece models over a joint vocabulary) round-trips through a checkpoint."""

import torch
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import CKPT_MODEL_CONFIG, load_checkpoint, tokenizer_entries
from transformer_nmt.data.tokenizer import Tokenizer, train_sentencepiece
from transformer_nmt.model.transformer import Transformer, TransformerConfig

OLD_KEYS = ("activation", "output_bias")


def test_a_checkpoint_without_the_options_is_the_paper_network(tmp_path):
    tokenizer = tiny_tokenizer()
    write_checkpoint(tmp_path / "old.ckpt", tokenizer)
    checkpoint = torch.load(tmp_path / "old.ckpt", weights_only=True)
    for key in OLD_KEYS:  # as written before the options existed
        checkpoint[CKPT_MODEL_CONFIG].pop(key)
    torch.save(checkpoint, tmp_path / "old.ckpt")
    model, _, _ = load_checkpoint(tmp_path / "old.ckpt")
    assert "output_bias" not in model.state_dict() and model.output_bias is None
    x = torch.randn(2, 5, model.config.d_model)
    ff = model.encoder_layers[0].feed_forward
    relu = torch.clamp(x @ ff.linear1.weight.T + ff.linear1.bias, min=0) @ ff.linear2.weight.T + ff.linear2.bias
    torch.testing.assert_close(ff(x), relu, rtol=0, atol=1e-6)  # FFN(x) = max(0, x W1 + b1) W2 + b2
    torch.testing.assert_close(model.project(x), x @ model.src_embed.weight.T, rtol=0, atol=1e-6)  # no bias


def test_swish_gelu_and_the_output_bias_compute_what_they_say():
    for activation, reference in (("swish", lambda h: h * torch.sigmoid(h)),
                                  ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / 2 ** 0.5)))):
        model = Transformer(TransformerConfig(vocab_size=30, d_model=8, n_heads=2, d_ff=12, activation=activation,
                                              output_bias=True, n_encoder_layers=1, n_decoder_layers=1))
        ff = model.decoder_layers[0].feed_forward
        x = torch.randn(3, 4, 8)
        expected = reference(x @ ff.linear1.weight.T + ff.linear1.bias) @ ff.linear2.weight.T + ff.linear2.bias
        torch.testing.assert_close(ff(x), expected, rtol=0, atol=1e-5)
        with torch.no_grad():
            model.output_bias.copy_(torch.arange(30.0))
        torch.testing.assert_close(model.project(x), x @ model.src_embed.weight.T + torch.arange(30.0), rtol=0,
                                   atol=1e-5)
    try:
        TransformerConfig(vocab_size=30, activation="tanh")
    except ValueError as error:
        assert "model.activation" in str(error)
    else:
        raise AssertionError("activation=tanh was accepted")


def split_tokenizer() -> Tokenizer:
    """English and German SentencePiece models over a joint vocabulary: specials, then every piece of each."""
    en = train_sentencepiece(iter(multi30k_lines("train", "en", 300)), vocab_size=120)
    de = train_sentencepiece(iter(multi30k_lines("train", "de", 300)), vocab_size=140)
    pieces = ["<pad>", "<unk>", "<s>", "</s>"]
    for sp in (en, de):
        pieces += [p for p in (sp.id_to_piece(i) for i in range(4, sp.vocab_size)) if p not in pieces]
    return Tokenizer(en.model_proto, de.model_proto, pieces), en, de


def test_split_tokenizer_sides_and_checkpoint(tmp_path):
    tokenizer, en, de = split_tokenizer()
    pieces = tokenizer.pieces
    source, target = "A man rides a bike.", "Ein Mann fährt Fahrrad."
    # each side splits with its own model, and the ids are the pieces' places in the joint vocabulary
    assert [pieces[i] for i in tokenizer.encode(source)] == en._sp.encode(source, out_type=str)
    assert [pieces[i] for i in tokenizer.encode(target, target=True)] == de._sp.encode(target, out_type=str)
    assert tokenizer.encode(target) != tokenizer.encode(target, target=True)
    assert tokenizer.decode(tokenizer.encode(target, target=True) + [3, 0]) == target
    assert tokenizer.encode("€")[-1] == 1 and "€" not in pieces  # a piece outside the vocabulary: unk
    assert not tokenizer.single_file and tokenizer.digest() != en.digest()
    write_checkpoint(tmp_path / "split.ckpt", tokenizer)
    checkpoint = torch.load(tmp_path / "split.ckpt", weights_only=True)
    checkpoint.update(tokenizer_entries(tokenizer))  # what the training module writes
    torch.save(checkpoint, tmp_path / "split.ckpt")
    _, loaded, _ = load_checkpoint(tmp_path / "split.ckpt")
    assert loaded == tokenizer and loaded.encode(target, target=True) == tokenizer.encode(target, target=True)
