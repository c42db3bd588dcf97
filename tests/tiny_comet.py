"""A tiny COMET model directory in Unbabel's layout, built here from a config, never downloaded: a SentencePiece
model trained on toy sentences, an XLM-R tokenizer and a 2-layer XLM-R config over it (``encoder/``), and random
weights for the whole regression model under COMET's key names in ``checkpoints/model.ckpt`` (a Lightning-style
checkpoint: ``state_dict`` and ``hyper_parameters``), its settings in ``hparams.yaml``. Needs transformers.

Also run as a script by the one-off comparison with unbabel-comet (docs/raw/comet_vs_unbabel.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml

HIDDEN_SIZES = [24, 8]  # the estimator's hidden layers


def write_tiny_comet(directory: Path, seed: int = 0, layer_norm: bool = True, pool: str = "avg") -> Path:
    """Writes ``directory``/{hparams.yaml, checkpoints/model.ckpt, encoder/} and returns ``directory``."""
    import sentencepiece as spm
    from toy_sentences import WORDS, sentences
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizer

    directory = Path(directory)
    encoder = directory / "encoder"
    encoder.mkdir(parents=True, exist_ok=True)
    corpus = directory / "spm_corpus.txt"
    corpus.write_text("\n".join(sentences(400, seed) + [" ".join(WORDS)]) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / "spm"), vocab_size=60,
                                   model_type="unigram", bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
                                   hard_vocab_limit=False, minloglevel=2)
    shutil.copy(directory / "spm.model", encoder / "sentencepiece.bpe.model")
    tokenizer = XLMRobertaTokenizer.from_pretrained(encoder, local_files_only=True)
    tokenizer.save_pretrained(encoder)
    settings = json.loads((encoder / "tokenizer_config.json").read_text(encoding="utf-8"))
    if not settings.get("extra_special_tokens"):  # transformers 5 writes [], which transformers 4 cannot read
        settings.pop("extra_special_tokens", None)
        (encoder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    config = XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=24, pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config.save_pretrained(encoder)

    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = XLMRobertaModel(config, add_pooling_layer=False)
    state = {f"encoder.model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for key in state:  # initialized norms (weight 1, bias 0) would make COMET's per-sentence layer norm a no-op
        if "LayerNorm" in key:
            state[key] += 0.5 * torch.randn(state[key].shape, generator=generator)
    for i in range(config.num_hidden_layers + 1):
        state[f"layerwise_attention.scalar_parameters.{i}"] = torch.randn(1, generator=generator)
    state["layerwise_attention.gamma"] = 1 + 0.5 * torch.rand(1, generator=generator)
    state["layerwise_attention.dropout_mask"] = torch.zeros(config.num_hidden_layers + 1)  # COMET's buffers
    state["layerwise_attention.dropout_fill"] = torch.full((config.num_hidden_layers + 1,), -1e20)
    widths = [6 * config.hidden_size, *HIDDEN_SIZES, 1]
    for j, (n_in, n_out) in enumerate(zip(widths, widths[1:])):  # Linear, Tanh, Dropout: keys ff.0, ff.3, ff.6
        state[f"estimator.ff.{3 * j}.weight"] = torch.randn(n_out, n_in, generator=generator) / n_in ** 0.5
        state[f"estimator.ff.{3 * j}.bias"] = 0.1 * torch.randn(n_out, generator=generator)
    hparams = {"activations": "Tanh", "batch_size": 4, "class_identifier": "regression_metric", "dropout": 0.1,
               "encoder_learning_rate": 1.0e-06, "encoder_model": "XLM-RoBERTa", "final_activation": None,
               "hidden_sizes": HIDDEN_SIZES, "keep_embeddings_frozen": True, "layer": "mix", "layer_norm": layer_norm,
               "layer_transformation": "softmax", "layerwise_decay": 0.95, "learning_rate": 1.5e-05, "loss": "mse",
               "nr_frozen_epochs": 0.3, "optimizer": "AdamW", "pool": pool, "pretrained_model": str(encoder),
               "train_data": [], "validation_data": [], "warmup_steps": 0, "load_pretrained_weights": False,
               "local_files_only": True}
    (directory / "hparams.yaml").write_text(yaml.safe_dump(hparams), encoding="utf-8")
    (directory / "checkpoints").mkdir(exist_ok=True)
    torch.save({"state_dict": state, "hyper_parameters": hparams, "pytorch-lightning_version": "2.2.0"},
               directory / "checkpoints" / "model.ckpt")
    return directory


SAMPLES = [  # (source, hypothesis, reference)
    ("the dog runs under the tree", "der Hund läuft", "der Hund läuft unter dem Baum"),
    ("a small cat sleeps", "die kleine Katze schläft", "eine kleine Katze schläft"),
    ("the big red house", "das rote Haus", "das große rote Haus"),
    ("a green tree", "ein grüner Baum der Baum der Baum der Baum der Baum der Baum der Baum", "ein grüner Baum"),
]

if __name__ == "__main__":
    import sys

    write_tiny_comet(Path(sys.argv[1]))
