"""MarianMT interchange (interchange/marian.py), proven against transformers itself, offline.

Export: the trained tiny checkpoint of tiny_checkpoint.trained_checkpoint (shared with test_ctranslate2 and
test_explore) and a random 2+2 model with swish, an output bias and untied embeddings, exported and loaded
by MarianMTModel / MarianTokenizer / pipeline: logits within 1e-4 of ours, greedy and beam 4 (alpha 0, where
the length penalties agree) token for token. Import: MarianMT directories built here the way opus-mt ones
are (eos 0, unk 1, pad last and the decoder's start; random weights with a random final_logits_bias; relu
with one SentencePiece model, swish with separate source and target ones over a joint vocabulary), imported:
our logits within 1e-4 of transformers', greedy identical; round trips give identical weights; fine-tuning
an imported checkpoint through train's init_from lowers its loss.
"""

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tiny_checkpoint import multi30k_lines, tiny_tokenizer  # noqa: E402

from transformer_nmt.checkpoint import atomic_torch_save, load_checkpoint  # noqa: E402
from transformer_nmt.data.tokenizer import train_sentencepiece  # noqa: E402
from transformer_nmt.generation.config import DecodeConfig  # noqa: E402
from transformer_nmt.generation.search import max_output_lengths  # noqa: E402
from transformer_nmt.inference.translate import encode_sources, translate_ids  # noqa: E402
from transformer_nmt.interchange.marian import (  # noqa: E402
    ConversionError,
    check_exportable,
    export_marian,
    import_marian,
    imported_checkpoint,
)
from transformer_nmt.model.transformer import Transformer, TransformerConfig  # noqa: E402

N_SENTENCES = 24  # studies/marian_exactness.py runs the same proofs on 300
TOLERANCE = 1e-4  # fp32 logits: the two implementations sum in other orders
OFFSET = DecodeConfig().max_len_offset


@pytest.fixture(scope="module")
def sentences():
    return multi30k_lines("val", "en", N_SENTENCES), multi30k_lines("val", "de", N_SENTENCES)


def padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(r) for r in rows], batch_first=True, padding_value=pad)


def hf_greedy(hf_model, src: torch.Tensor, pad: int, limits: list[int], eos: int) -> list[list[int]]:
    """transformers' greedy ids per sentence, without the start token, cut at eos or at our length limit (greedy
    search is the same prefix whatever the limit, so one batched call serves every limit)."""
    out = hf_model.generate(input_ids=src, attention_mask=src != pad, num_beams=1, do_sample=False,
                            max_new_tokens=max(limits), min_length=0)
    rows = []
    for row, limit in zip(out[:, 1:].tolist(), limits):
        row = row[:limit]
        rows.append(row[: row.index(eos)] if eos in row else row)
    return rows


# ------------------------------------------------------------------------------------------------ export


@pytest.fixture(scope="module")
def trained(trained_checkpoint_path):
    return load_checkpoint(trained_checkpoint_path)


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    model, tokenizer, meta = trained
    return export_marian(model, tokenizer, tmp_path_factory.mktemp("marian") / "model", meta)


@pytest.fixture(scope="module")
def hf_exported(exported):
    return (transformers.MarianMTModel.from_pretrained(exported).eval(),
            transformers.MarianTokenizer.from_pretrained(exported))


def test_export_is_a_marian_directory(exported, trained):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "source.spm", "target.spm", "vocab.json",
            "tokenizer_config.json", "README.md"} <= names
    generation = json.loads((exported / "generation_config.json").read_text())
    assert (generation["decoder_start_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (2, 3, 0)
    assert generation["suppress_tokens"] == [0, 2] and generation["renormalize_logits"] is True
    vocab = json.loads((exported / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == {trained[1].id_to_piece(i): i for i in range(trained[1].vocab_size)}
    assert "pipeline_tag: translation" in (exported / "README.md").read_text()


def test_export_logits_equal_ours(trained, hf_exported, sentences):
    model, tokenizer, _ = trained
    hf_model, hf_tokenizer = hf_exported
    sources, references = sentences
    batch = hf_tokenizer(sources, text_target=references, return_tensors="pt", padding=True)
    ours_src = encode_sources(tokenizer, sources, model.config.max_positions)
    assert [row[row != 0].tolist() for row in batch["input_ids"]] == ours_src  # same ids, eos appended
    labels = batch["labels"]  # (B, T): reference ids + eos, padded with pad (0)
    assert [row[row != 0].tolist() for row in labels] == [ids + [3] for ids in
                                                         tokenizer.encode_batch(references, target=True)]
    tgt_in = torch.cat([torch.full((len(sources), 1), tokenizer.bos_id), labels[:, :-1]], dim=1)  # (B, T)
    with torch.no_grad():
        theirs = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          decoder_input_ids=tgt_in).logits
        ours = model(batch["input_ids"], tgt_in)
    real = labels != 0  # every position whose prediction is scored
    assert theirs.shape == ours.shape
    assert (theirs - ours)[real].abs().max() < TOLERANCE


def test_export_greedy_identical(trained, hf_exported, sentences):
    model, tokenizer, _ = trained
    hf_model, _ = hf_exported
    src_ids, greedy = translate_ids(model, tokenizer, sentences[0], beam=1)
    src = padded(src_ids, 0)
    limits = max_output_lengths(model, src, OFFSET).tolist()
    assert hf_greedy(hf_model, src, 0, limits, 3) == [h[0][0] for h in greedy]


def test_export_beam_identical_at_alpha_0(trained, hf_exported, sentences):
    """Beam 4 where the length penalties agree (alpha 0: 1 on both sides) and transformers' stop rule is the
    bound's ("never"). One batch: no hypothesis of ours reaches its length limit (checked), so transformers' one
    limit for the batch changes nothing."""
    model, tokenizer, _ = trained
    hf_model, _ = hf_exported
    src_ids, beams = translate_ids(model, tokenizer, sentences[0], beam=4, alpha=0.0)
    src = padded(src_ids, 0)
    limits = max_output_lengths(model, src, OFFSET).tolist()
    assert all(len(hyps[0][0]) < limit for hyps, limit in zip(beams, limits))
    out = hf_model.generate(input_ids=src, attention_mask=src != 0, num_beams=4, length_penalty=0.0,
                            early_stopping="never", max_new_tokens=max(limits))
    assert [[t for t in row if t not in (0, 3)] for row in out[:, 1:].tolist()] == [h[0][0] for h in beams]


def test_generate_and_decode_translate_as_we_do(trained, hf_exported, sentences):
    """What pipeline("translation") did (transformers 5 removed it): MarianTokenizer, generate with the
    directory's generation config (greedy here), batch_decode(skip_special_tokens=True)."""
    model, tokenizer, _ = trained
    hf_model, hf_tokenizer = hf_exported
    src_ids, greedy = translate_ids(model, tokenizer, sentences[0], beam=1)
    ours = [hyps[0][0] for hyps in greedy]
    out = hf_model.generate(**hf_tokenizer(sentences[0], return_tensors="pt", padding=True), num_beams=1)
    theirs = hf_tokenizer.batch_decode(out, skip_special_tokens=True)
    assert all(1 not in ids for ids in ours)  # no unknown piece: MarianTokenizer drops it, we print " \u2047 "
    # Our length limit is the source's + 50; transformers' one max_length (max_positions): a degenerate output that
    # reaches ours goes on there (test_export_greedy_identical shows the same ids up to it).
    ended = [i for i, (ids, src) in enumerate(zip(ours, src_ids)) if len(ids) < len(src) + OFFSET]
    assert len(ended) >= N_SENTENCES - 2
    assert [theirs[i] for i in ended] == [tokenizer.decode(ours[i]) for i in ended]


def test_pipeline_translates_as_we_do(trained, exported, sentences):
    if "translation" not in transformers.pipelines.SUPPORTED_TASKS:
        pytest.skip(f"transformers {transformers.__version__} has no translation pipeline (removed in 5.0); "
                    f"test_generate_and_decode_translate_as_we_do runs what it did")
    model, tokenizer, _ = trained
    translator = transformers.pipeline("translation", model=str(exported), device="cpu")
    ours = [hyps[0][0] for hyps in translate_ids(model, tokenizer, sentences[0], beam=1)[1]]
    theirs = [out["translation_text"] for out in translator(sentences[0], num_beams=1)]
    assert theirs == [tokenizer.decode(ids) for ids in ours]


def random_model(tokenizer, **config) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4,
                                          n_encoder_layers=2, n_decoder_layers=2, d_ff=48, max_positions=96,
                                          dropout=0.0, **config)).eval()
    if model.output_bias is not None:
        with torch.no_grad():
            model.output_bias.normal_()
            model.output_bias[[0, 2, 3]] += torch.tensor([4.0, 4.0, 4.0])  # pad and bos likely; eos ends sentences
    return model


def test_swish_bias_untied_export_and_round_trip(tmp_path, sentences):
    """Every branch of the layout at once: swish, an output bias, three embedding matrices; the exported logits
    equal ours and the import gives back the very tensors."""
    tokenizer = tiny_tokenizer()
    model = random_model(tokenizer, activation="swish", output_bias=True, tie_embeddings=False)
    directory = export_marian(model, tokenizer, tmp_path / "m")
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    src = padded(encode_sources(tokenizer, sentences[0], 96), 0)
    tgt_in = padded([[2] + ids for ids in tokenizer.encode_batch(sentences[1], target=True)], 0)
    with torch.no_grad():
        difference = (hf_model(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt_in).logits
                      - model(src, tgt_in))
    assert difference[tgt_in != 0].abs().max() < TOLERANCE
    # Beam 4 at alpha 0 (see test_export_beam_identical_at_alpha_0). Untrained, pad and bos hold real probability:
    # only their suppression with renormalisation gives transformers our scores.
    src_ids, beams = translate_ids(model, tokenizer, sentences[0][:8], beam=4, alpha=0.0)
    limits = max_output_lengths(model, padded(src_ids, 0), OFFSET).tolist()
    assert all(len(hyps[0][0]) < limit for hyps, limit in zip(beams, limits))
    src = padded(src_ids, 0)
    out = hf_model.generate(input_ids=src, attention_mask=src != 0, num_beams=4, length_penalty=0.0,
                            early_stopping="never", max_new_tokens=max(limits), return_dict_in_generate=True,
                            output_scores=True)
    assert [[t for t in row if t not in (0, 3)] for row in out.sequences[:, 1:].tolist()] == [h[0][0] for h in beams]
    # and the same scores: sums of log-probabilities renormalised without pad and bos
    torch.testing.assert_close(out.sequences_scores, torch.tensor([h[0][1] for h in beams]), rtol=0, atol=TOLERANCE)
    back, back_tokenizer, info = import_marian(directory)
    assert back.config == model.config and back_tokenizer == tokenizer and not info["added_bos"]
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_trained_round_trip_identical(trained, exported):
    model, tokenizer, _ = trained
    back, back_tokenizer, _ = import_marian(exported)
    assert back.config == model.config and back_tokenizer == tokenizer and back_tokenizer.single_file
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("change, reason", [
    ({"positions": "learned"}, "model.positions=learned"), ({"positions": "rotary"}, "model.positions=rotary"),
    ({"positions": "none"}, "model.positions=none"), ({"norm_first": True}, "post-LN"),
    ({"norm": "rmsnorm"}, "model.norm=rmsnorm: MarianMTModel has LayerNorm only"),
    ({"activation": "swiglu"}, "model.activation=swiglu: .* a gated one cannot be exported"),
    ({"activation": "geglu"}, "model.activation=geglu"), ({"d_k": 4}, "row B"), ({"d_v": 4}, "row B")])
def test_export_refuses_what_marian_cannot_hold(change, reason):
    config = TransformerConfig(vocab_size=50, d_model=16, n_heads=2, **change)
    tokenizer = type("T", (), {"vocab_size": 50})()
    with pytest.raises(ConversionError, match=reason):
        check_exportable(config, tokenizer)


# ------------------------------------------------------------------------------------------------ import


def marian_directory(path, activation: str, separate: bool):
    """A MarianMT directory as opus-mt's are laid out: vocab.json eos 0, unk 1, every piece of the SentencePiece
    model(s), pad last; the decoder starts from pad; random weights (init_std 0.3: peaked distributions, so
    that greedy search does not hinge on ties) and a random final_logits_bias."""
    en, de = multi30k_lines("train", "en", 400), multi30k_lines("train", "de", 400)
    if separate:
        models = [train_sentencepiece(iter(en), vocab_size=150), train_sentencepiece(iter(de), vocab_size=170)]
    else:
        models = [train_sentencepiece(iter(en + de), vocab_size=200)] * 2
    pieces = ["</s>", "<unk>"]
    for sp in models:
        pieces += [p for p in (sp.id_to_piece(i) for i in range(4, sp.vocab_size)) if p not in pieces]
    pieces.append("<pad>")
    vocab = {piece: i for i, piece in enumerate(pieces)}
    pad = len(pieces) - 1
    config = transformers.MarianConfig(
        vocab_size=len(pieces), decoder_vocab_size=len(pieces), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        activation_function=activation, max_position_embeddings=128, scale_embedding=True, pad_token_id=pad,
        eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=None, init_std=0.3, dropout=0.1)
    torch.manual_seed(1)
    hf_model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        hf_model.final_logits_bias.normal_()
    hf_model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=pad, eos_token_id=0, pad_token_id=pad, bad_words_ids=[[pad]], forced_eos_token_id=None)
    hf_model.save_pretrained(path)
    (path / "source.spm").write_bytes(models[0].model_proto)
    (path / "target.spm").write_bytes(models[1].model_proto)
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    transformers.MarianTokenizer(str(path / "source.spm"), str(path / "target.spm"), str(path / "vocab.json"),
                                 model_max_length=128).save_pretrained(path)
    return path, hf_model, transformers.MarianTokenizer.from_pretrained(path)


@pytest.fixture(scope="module", params=[("relu", False), ("swish", True)], ids=["relu-shared", "swish-separate"])
def marian(request, tmp_path_factory):
    activation, separate = request.param
    path, hf_model, hf_tokenizer = marian_directory(tmp_path_factory.mktemp("opus") / "model", activation, separate)
    model, tokenizer, info = import_marian(path)
    return path, hf_model, hf_tokenizer, model, tokenizer, info, separate


def test_import_logits_and_greedy_equal_transformers(marian, sentences):
    path, hf_model, hf_tokenizer, model, tokenizer, info, separate = marian
    pad = hf_model.config.pad_token_id
    order = [pad, 1, pad, 0] + list(range(2, pad))  # ours -> MarianMT: pad, unk, bos (the start: pad), eos, rest
    assert info["added_bos"] and model.config.vocab_size == pad + 2 and model.config.output_bias
    assert (tokenizer.target_proto is not None) == separate
    to_ours = {marian_id: ours for ours, marian_id in enumerate(order) if ours != 2}
    sources, references = sentences
    batch = hf_tokenizer(sources, text_target=references, return_tensors="pt", padding=True)
    src = padded(encode_sources(tokenizer, sources, 128), 0)
    assert torch.equal(src, batch["input_ids"].apply_(lambda i: to_ours[i]))  # the same pieces, our ids
    labels = batch["labels"].apply_(lambda i: to_ours[i])
    assert [row[row != 0].tolist() for row in labels] == [ids + [3] for ids in
                                                         tokenizer.encode_batch(references, target=True)]
    tgt_in = torch.cat([torch.full((len(sources), 1), 2), labels[:, :-1]], dim=1)  # (B, T), from bos (= pad there)
    hf_in = torch.tensor([[order[i] for i in row] for row in tgt_in.tolist()])
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor([[order[i] for i in row] for row in src.tolist()]),
                          attention_mask=src != 0, decoder_input_ids=hf_in).logits  # (B, T, V)
        ours = model(src, tgt_in)[..., [j for j in range(len(order)) if j != 2]]  # bos's column: a copy of pad's
    real = labels != 0
    assert (theirs[..., [order[j] for j in range(len(order)) if j != 2]] - ours)[real].abs().max() < TOLERANCE

    # Random weights rarely choose eos: a short length limit (source + 10) keeps the search short on both sides.
    src_ids, greedy = translate_ids(model, tokenizer, sources, beam=1, max_len_offset=10)
    limits = max_output_lengths(model, src, 10).tolist()
    hf_src = padded([[order[i] for i in ids] for ids in src_ids], pad)
    theirs = hf_greedy(hf_model, hf_src, pad, limits, 0)
    assert theirs == [[order[i] for i in hyps[0][0]] for hyps in greedy]


def test_import_refuses_with_a_reason(marian, tmp_path):
    path = marian[0]
    for change, reason in (({"model_type": "bart"}, "not 'marian'"), ({"activation_function": "gelu_new"}, "gelu_new"),
                           ({"scale_embedding": False}, "scale_embedding"),
                           ({"decoder_ffn_dim": 32}, "decoder_ffn_dim")):
        broken = tmp_path / reason.replace(" ", "_").replace("'", "")
        shutil.copytree(path, broken)
        config = json.loads((broken / "config.json").read_text())
        (broken / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ConversionError, match=reason):
            import_marian(broken)


def test_imported_checkpoint_loads_and_fine_tunes(marian, tmp_path):
    """The command's checkpoint loads like a trained one, and train's init_from fine-tunes it: the loss on the
    training pairs falls."""
    _, _, _, model, tokenizer, info, separate = marian
    if not separate:
        pytest.skip("one fine-tuning run covers the split tokenizer, the harder case")
    from tiny_corpus import tiny_config, write_tiny_corpus

    from transformer_nmt.training.app import train

    ckpt = tmp_path / "imported.ckpt"
    atomic_torch_save(imported_checkpoint(model, tokenizer, info), ckpt)
    loaded, loaded_tokenizer, _ = load_checkpoint(ckpt)
    assert loaded_tokenizer == tokenizer and all(torch.equal(a, b) for a, b in
                                                 zip(loaded.state_dict().values(), model.state_dict().values()))
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=48, n_eval=8)
    cfg = tiny_config(corpus, f"init_from={ckpt}", "data.max_positions=128", "trainer.max_steps=6",
                      "trainer.limit_val_batches=0", "train.val_bleu_max_sentences=0", "train.warmup_steps=4",
                      "train.lr_factor=0.2", "checkpoint.save_top_k=0", "model.dropout=0.0")
    train(cfg, tmp_path / "run")
    tuned, tuned_tokenizer, _ = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert tuned_tokenizer == tokenizer and tuned.config.d_model == model.config.d_model

    def loss(m):
        src = padded(encode_sources(tokenizer, multi30k_lines("train", "en", 48), 128), 0)
        tgt = padded([[2] + ids + [3] for ids in tokenizer.encode_batch(multi30k_lines("train", "de", 48),
                                                                          target=True)], 0)
        with torch.no_grad():
            logits = m(src, tgt[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0).item()

    before, after = loss(model), loss(tuned)
    assert after < before - 0.1, (before, after)
    # it started from the imported weights (a fresh initialisation would be unrelated to them)
    start, end = model.src_embed.weight.flatten(), tuned.src_embed.weight.flatten()
    assert torch.nn.functional.cosine_similarity(start, end, dim=0) > 0.9


def test_transformers_stays_out_of_the_import_path():
    """transformers costs seconds to import: only the conversions load it, inside their functions."""
    import subprocess
    import sys

    code = ("import sys, transformer_nmt.interchange.marian, transformer_nmt.inference.export, "
            "transformer_nmt.inference.translate, transformer_nmt.import_marian; "
            "print(sorted(m for m in ('transformers', 'safetensors', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_model_card_quotes_the_scores_beside_the_checkpoint(tmp_path):
    from transformer_nmt.interchange.marian import model_card

    run = tmp_path / "run"
    (run / "checkpoints" / "eval").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"val_bleu": 12.5, "test_bleu": 11.25, "steps": 40}))
    for name, ckpt in (("test", "last.ckpt"), ("other", "averaged.ckpt")):
        (run / "checkpoints" / "eval" / f"{name}.json").write_text(json.dumps(
            {"checkpoint": f"x/{ckpt}", "sentences": 1000, "beam": 4, "alpha": 0.6, "bleu": 33.3, "chrf": 55.5,
             "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0", "chrf_signature": "c"}))
    card = model_card(TransformerConfig(vocab_size=10), {"path": str(run / "checkpoints" / "last.ckpt"),
                                                         "data_config": {"src_lang": "en", "tgt_lang": "de"}},
                      "python -m transformer_nmt.export format=marian")
    assert "val_bleu 12.5, test_bleu 11.25, steps 40" in card
    assert "`test` (1000 sentences, beam 4, alpha 0.6): BLEU 33.3 (`nrefs:1|case:mixed" in card
    assert "`other`" not in card  # another checkpoint's scores
    assert "python -m transformer_nmt.export format=marian" in card and "- en\n- de" in card


def test_a_tagged_models_export_keeps_its_tags_whole_and_generates_as_we_do(tmp_path):
    """A model of several pairs (data.pairs, tags <2de> ...): the export registers the tags as special tokens, so
    MarianTokenizer reads '<2fr>' as the one id ours has (not '▁' then the tag) and "<2fr> text" as the ids
    Direction.encode gives; generate from those ids gives our greedy output, token for token."""
    from test_multilingual import train_toy_model, write_toy_languages

    from transformer_nmt.data.language_tags import LanguageTags

    corpus = write_toy_languages(tmp_path / "toy")
    train_toy_model(corpus, tmp_path / "toy.ckpt", steps=60)
    model, tokenizer, meta = load_checkpoint(tmp_path / "toy.ckpt")
    out = export_marian(model, tokenizer, tmp_path / "marian", meta)
    hf_model = transformers.MarianMTModel.from_pretrained(out).eval()
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(out)
    tags = LanguageTags.of(meta["data_config"])
    for piece in tags.pieces():
        assert hf_tokenizer(piece, add_special_tokens=False)["input_ids"] == [tokenizer.piece_id(piece)]
    lines = (corpus / "test.en").read_text().splitlines()[:8]
    for tgt in ("fr", "cs"):
        direction = tags.direction("en", tgt)
        src_ids, greedy = translate_ids(model, tokenizer, lines, beam=1, direction=direction)
        assert hf_tokenizer([f"<2{tgt}> {line}" for line in lines])["input_ids"] == src_ids
        src = padded(src_ids, 0)
        limits = max_output_lengths(model, src, OFFSET).tolist()
        assert hf_greedy(hf_model, src, 0, limits, 3) == [h[0][0] for h in greedy]
