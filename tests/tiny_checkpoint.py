"""Small self-contained checkpoints (a random tiny model + a SentencePiece model trained on a slice of
Multi30k) for tests of the tools that read checkpoints."""

import gzip
from pathlib import Path

import torch

from transformer_nmt.checkpoint import atomic_torch_save
from transformer_nmt.model import Transformer, TransformerConfig
from transformer_nmt.tokenizer import train_sentencepiece
from transformer_nmt.training import CKPT_MODEL_CONFIG, CKPT_TOKENIZER

MULTI30K = Path(__file__).resolve().parent.parent / "data" / "multi30k"


def multi30k_lines(split, lang, n):
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def tiny_tokenizer(vocab_size=200):
    sentences = multi30k_lines("train", "en", 300) + multi30k_lines("train", "de", 300)
    return train_sentencepiece(iter(sentences), vocab_size=vocab_size)


def write_checkpoint(path, tokenizer, seed=0, step=10, max_positions=64):
    """Write a loadable checkpoint of a random 1+1-layer model; returns the model."""
    torch.manual_seed(seed)
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
                               n_decoder_layers=1, d_ff=32, dropout=0.0, max_positions=max_positions)
    model = Transformer(config)
    checkpoint = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                  CKPT_MODEL_CONFIG: config.to_dict(), CKPT_TOKENIZER: tokenizer.model_proto,
                  "global_step": step, "epoch": 0}
    atomic_torch_save(checkpoint, path)
    return model
