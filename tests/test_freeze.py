"""train.freeze: parameters matching a pattern keep their values, take no optimizer state, and a pattern that matches
nothing is refused; a fine-tune of a smoke checkpoint with the encoder frozen changes only the decoder."""

import pytest
import torch
from tiny_corpus import tiny_config, write_tiny_corpus

from transformer_nmt.checkpoint import read_checkpoint
from transformer_nmt.model.transformer import Transformer, TransformerConfig
from transformer_nmt.training.app import train
from transformer_nmt.training.freezing import freeze


def small_model(**kw) -> Transformer:
    return Transformer(TransformerConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                                         n_decoder_layers=2, **kw))


def test_patterns_freeze_exactly_the_parameters_they_name_and_count_them():
    model = small_model()
    counts = freeze(model, ["encoder_layers.*", "*norm*"])
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    expected = {name for name, _ in model.named_parameters()
                if name.startswith("encoder_layers.") or "norm" in name}
    assert frozen == expected and any(n.startswith("decoder_layers.") and "norm" in n for n in frozen)
    total = sum(p.numel() for p in model.parameters())
    assert counts == {"frozen": sum(p.numel() for n, p in model.named_parameters() if n in expected),
                      "trainable": total - counts["frozen"]}
    assert counts["frozen"] > 0 and counts["trainable"] > 0


def test_a_tied_embedding_is_frozen_under_any_of_its_names():
    model = small_model(tie_embeddings=True)
    assert model.tgt_embed.weight is model.src_embed.weight
    freeze(model, ["tgt_embed.*"])  # named_parameters() lists the shared tensor once, as src_embed.weight
    assert not model.src_embed.weight.requires_grad


@pytest.mark.parametrize("pattern", ["encoder.*", "nothing", ""])
def test_a_pattern_that_matches_nothing_is_refused_naming_it(pattern):
    model = small_model()
    with pytest.raises(ValueError, match=r"train\.freeze: .* (matches no parameter|is not a parameter name)"):
        freeze(model, ["decoder_layers.*", pattern])
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen by a refused list


def test_fine_tuning_with_the_encoder_frozen_keeps_it_bit_identical_and_trains_the_decoder(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus")
    train(tiny_config(corpus, "trainer.max_steps=3", "trainer.limit_val_batches=0", "model.tie_embeddings=false"),
          tmp_path / "parent")
    parent = read_checkpoint(tmp_path / "parent" / "checkpoints" / "last.ckpt")["state_dict"]
    patterns = ["encoder_layers.*", "src_embed.*"]  # (post-norm: no encoder_norm)
    trainer = train(tiny_config(corpus, f"init_from={tmp_path / 'parent' / 'checkpoints' / 'last.ckpt'}",
                                f"train.freeze=[{','.join(patterns)}]", "trainer.max_steps=4",
                                "trainer.limit_val_batches=0"), tmp_path / "child")
    child = read_checkpoint(tmp_path / "child" / "checkpoints" / "last.ckpt")
    weights = child["state_dict"]
    frozen = [k for k in parent if k.startswith(("model.encoder_layers.", "model.encoder_norm.", "model.src_embed."))]
    assert len(frozen) > 10
    for key in frozen:
        assert torch.equal(weights[key], parent[key]), key
    changed = [k for k in parent if k.startswith("model.decoder_layers.") and not torch.equal(weights[k], parent[k])]
    assert len(changed) > 10
    # Adam is given the trainable tensors only, and holds state for them only
    trainable = [p for p in trainer.lightning_module.parameters() if p.requires_grad]
    given = [p for group in trainer.optimizers[0].param_groups for p in group["params"]]
    assert len(given) == len(trainable) and all(p.requires_grad for p in given)
    assert len(child["optimizer_states"][0]["state"]) == len(trainable) < len(parent)


def test_the_freeze_list_is_part_of_the_run_fingerprint(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus")
    train(tiny_config(corpus, "trainer.max_steps=2", "trainer.limit_val_batches=0"), tmp_path / "run")
    from transformer_nmt.training.fingerprint import ResumeError
    with pytest.raises((ResumeError, SystemExit, ValueError), match="train.freeze"):
        train(tiny_config(corpus, "trainer.max_steps=4", "trainer.limit_val_batches=0",
                          "train.freeze=[decoder_layers.*]"), tmp_path / "run")


def test_a_fine_tune_keeps_its_checkpoints_vocabulary_and_refuses_another_tokenizer_path(tmp_path):
    from tiny_checkpoint import tiny_tokenizer

    from transformer_nmt.checkpoint import checkpoint_tokenizer
    from transformer_nmt.training.app import ConfigError

    corpus = write_tiny_corpus(tmp_path / "corpus")
    train(tiny_config(corpus, "trainer.max_steps=1", "trainer.limit_val_batches=0"), tmp_path / "parent")
    parent = tmp_path / "parent" / "checkpoints" / "last.ckpt"
    other = tmp_path / "other.model"
    tiny_tokenizer().save(other)
    with pytest.raises(ConfigError, match=rf"init_from={parent} with data.tokenizer_path={other}: that is another "
                                          r"vocabulary .* would no longer match"):
        train(tiny_config(corpus, f"init_from={parent}", f"data.tokenizer_path={other}", "trainer.max_steps=2"),
              tmp_path / "child")
    same = tmp_path / "same.model"
    checkpoint_tokenizer(read_checkpoint(parent), parent).save(same)
    trainer = train(tiny_config(corpus, f"init_from={parent}", f"data.tokenizer_path={same}", "trainer.max_steps=2",
                                "trainer.limit_val_batches=0"), tmp_path / "child2")
    assert trainer.global_step == 2
