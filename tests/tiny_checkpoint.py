"""Small self-contained checkpoints (a random tiny model + a SentencePiece model trained on a slice of
Multi30k) for tests of the tools that read checkpoints."""

import gzip
import hashlib
import json
from pathlib import Path

import torch

from transformer_nmt import __version__
from transformer_nmt.checkpoint import (
    CKPT_FINGERPRINT,
    CKPT_MODEL_CONFIG,
    CKPT_RUN,
    CKPT_VERSION,
    atomic_torch_save,
    tokenizer_entries,
)
from transformer_nmt.data.tokenizer import Tokenizer, train_sentencepiece
from transformer_nmt.model.transformer import Transformer, TransformerConfig

MULTI30K = Path(__file__).resolve().parent.parent / "data" / "multi30k"


def multi30k_lines(split, lang, n):
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def tiny_tokenizer(vocab_size=200):
    sentences = multi30k_lines("train", "en", 300) + multi30k_lines("train", "de", 300)
    return train_sentencepiece(iter(sentences), vocab_size=vocab_size)


def reordered_pieces(tokenizer):
    """The same SentencePiece model with a joint vocabulary (pieces in id order, as an imported model carries)
    whose ids 10 and 11 are swapped: the source model's bytes equal, the ids of two pieces not."""
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    pieces[10], pieces[11] = pieces[11], pieces[10]
    return Tokenizer(tokenizer.model_proto, None, pieces)


def write_checkpoint(path, tokenizer, seed=0, step=10, max_positions=64, run=None, **config):
    """Write a loadable checkpoint of a random model (1+1 layers unless ``config`` overrides TransformerConfig),
    recording what a training run's checkpoint records besides: the version, the run identity (``run``; None: one
    run per seed) and a run fingerprint (the seed); returns the model."""
    torch.manual_seed(seed)
    config = TransformerConfig(**{"vocab_size": tokenizer.vocab_size, "d_model": 16, "n_heads": 2,
                                  "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32, "dropout": 0.0,
                                  "max_positions": max_positions, **config})
    model = Transformer(config)
    checkpoint = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                  CKPT_MODEL_CONFIG: config.to_dict(), **tokenizer_entries(tokenizer),
                  "global_step": step, "epoch": 0, CKPT_VERSION: __version__,
                  CKPT_RUN: run or f"run-of-seed-{seed}", CKPT_FINGERPRINT: {"seed": seed}}
    atomic_torch_save(checkpoint, path)
    return model


TRAINED_RECIPE = {"vocab_size": 1000, "steps": 300, "n_pairs": 3000, "batch_size": 48, "seed": 0}


def trained_checkpoint(cache_dir):
    """Path of a checkpoint trained with TRAINED_RECIPE (minutes on a busy CPU), written once into
    ``cache_dir`` (pytest's cache, or the session's temporary directory without it) under a name keyed by the
    recipe and the torch version."""
    key = hashlib.sha256(json.dumps([TRAINED_RECIPE, torch.__version__]).encode()).hexdigest()[:12]
    path = Path(cache_dir) / f"trained-{key}.ckpt"
    if not path.is_file():
        recipe = dict(TRAINED_RECIPE)
        tokenizer = train_sentencepiece(iter(multi30k_lines("train", "en", recipe["n_pairs"])
                                             + multi30k_lines("train", "de", recipe["n_pairs"])),
                                        vocab_size=recipe.pop("vocab_size"))
        train_checkpoint(path, tokenizer, **recipe)
    return path


def train_checkpoint(path, tokenizer, steps=300, n_pairs=3000, batch_size=48, seed=0, **config):
    """Write a checkpoint of a small model trained for ``steps`` Adam steps on Multi30k pairs (en->de), enough
    for translations that are not degenerate; returns the model. ``config`` overrides TransformerConfig."""
    torch.manual_seed(seed)
    config = TransformerConfig(**{"vocab_size": tokenizer.vocab_size, "d_model": 64, "n_heads": 4,
                                  "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 128, "dropout": 0.0,
                                  "max_positions": 128, **config})
    model = Transformer(config)
    src = tokenizer.encode_batch(multi30k_lines("train", "en", n_pairs))
    tgt = tokenizer.encode_batch(multi30k_lines("train", "de", n_pairs))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    pad = torch.nn.utils.rnn.pad_sequence
    for step in range(steps):
        rows = torch.randint(len(src), (batch_size,)).tolist()
        s = pad([torch.tensor(src[i][:60] + [tokenizer.eos_id]) for i in rows], batch_first=True)
        t = pad([torch.tensor([tokenizer.bos_id] + tgt[i][:60] + [tokenizer.eos_id]) for i in rows], batch_first=True)
        logits = model(s, t[:, :-1])  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t[:, 1:].flatten(), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    checkpoint = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                  CKPT_MODEL_CONFIG: config.to_dict(), **tokenizer_entries(tokenizer),
                  "global_step": steps, "epoch": 0}
    atomic_torch_save(checkpoint, path)
    return model
