"""COMET (Rei et al. 2020, 2022): a regression model over a multilingual encoder that estimates a translation's
quality from the source, the hypothesis and the reference; the corpus value is the mean of the sentences' values.

The model is read from a local directory in the layout Unbabel publishes (``Unbabel/wmt22-comet-da`` and the like):
``MODEL/hparams.yaml`` and ``MODEL/checkpoints/model.ckpt``. Both are data: the settings are read with
``yaml.safe_load``, the weights with ``torch.load(weights_only=True)``; nothing in them is imported or run. The
encoder (XLM-R, or another ``transformers`` encoder) is built from its ``config.json`` with random weights, then
given the checkpoint's, which hold the whole encoder; its tokenizer is read from the same local directory
(``metric.comet.encoder=DIR``, default ``MODEL/encoder``: a copy of the encoder's config and tokenizer files, e.g.
``xlm-roberta-large``'s without its weights). Nothing is downloaded: both are opened with
``local_files_only=True``. Needs ``transformers`` (``pip install "transformer_nmt[hf]"``), imported when a model is
first loaded. Unbabel's ``unbabel-comet`` package is not used: it pins numpy<2 and transformers<5, and its loader
unpickles a Lightning checkpoint.

What the model computes (COMET's ``RegressionMetric``, ``class_identifier: regression_metric``), for each sentence:

    h_l        the encoder's hidden states, l = 0 (embeddings) .. L                (n, t, d) each
    e          gamma * sum_l softmax(s)_l * norm(h_l)     layer mix (layer: mix; norm: a per-sentence layer norm
                                                          over the unpadded positions where layer_norm is true)
    x          mean of e over the unpadded positions      (n, d)   (pool: avg; cls: e[:, 0]; max)
    features   [x_mt, x_ref, x_mt * x_ref, |x_mt - x_ref|, x_mt * x_src, |x_mt - x_src|]   (n, 6d)
    value      feed-forward(features): Linear, activation, (dropout), ..., Linear to 1     (n,)

Unsupported COMET models (the reference-free and unified ones: CometKiwi, XCOMET) are refused with their class.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from transformer_nmt.file_digest import content_digest
from transformer_nmt.metrics.base import Metric, MetricResult, register
from transformer_nmt.options import option

HPARAMS, CHECKPOINT = "hparams.yaml", os.path.join("checkpoints", "model.ckpt")
SUPPORTED_CLASS = "regression_metric"
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}
POOLS = ("avg", "cls", "max")
# Buffers a checkpoint may hold that inference does not use: the layer mix's dropout masks, older transformers'
# position ids.
IGNORED_KEYS = ("layerwise_attention.dropout_mask", "layerwise_attention.dropout_fill")


@dataclass
class CometOptions:
    """COMET's settings (``metric.comet.KEY=VALUE``)."""

    model: Optional[str] = option(None, "a local COMET model directory (hparams.yaml and checkpoints/model.ckpt, "
                                        "as Unbabel publishes them); nothing is downloaded")
    encoder: Optional[str] = option(None, "a local directory with the encoder's config.json and tokenizer files "
                                          "(its weights are in the COMET checkpoint); null: MODEL/encoder")
    batch_size: int = option(16, "sentences per forward pass")
    device: str = option("auto", "cpu | cuda | auto (cuda where there is one)")


class LayerMix(nn.Module):
    """A softmax-weighted sum of the encoder's layers, scaled by ``gamma``; each layer optionally normalized per
    sentence over its unpadded positions first. Parameter names as in COMET's checkpoints."""

    def __init__(self, n_layers: int, layer_norm: bool):
        super().__init__()
        self.scalar_parameters = nn.ParameterList([nn.Parameter(torch.zeros(1)) for _ in range(n_layers)])
        self.gamma = nn.Parameter(torch.ones(1))
        self.layer_norm = layer_norm

    @staticmethod
    def normalized(h: Tensor, mask: Tensor) -> Tensor:
        """``h`` (n, t, d) less its mean, over its standard deviation, both taken per sentence over the unpadded
        positions (``mask`` (n, t), 1 where a token is) and every feature."""
        m = mask.unsqueeze(-1).to(h.dtype)  # (n, t, 1)
        count = mask.sum(1).to(h.dtype) * h.shape[-1]  # (n,)
        mean = (h * m).sum((1, 2)) / count  # (n,)
        variance = (((h * m - mean[:, None, None]) * m) ** 2).sum((1, 2)) / count  # (n,)
        return (h - mean[:, None, None]) / torch.sqrt(variance + 1e-12)[:, None, None]

    def forward(self, layers: tuple[Tensor, ...], mask: Tensor) -> Tensor:
        if len(layers) != len(self.scalar_parameters):
            raise ValueError(f"COMET layer mix: {len(layers)} encoder layers, but the checkpoint mixes "
                             f"{len(self.scalar_parameters)}")
        weights = torch.softmax(torch.cat(list(self.scalar_parameters)), dim=0)  # (L + 1,)
        mixed = sum(w * (self.normalized(h, mask) if self.layer_norm else h) for w, h in zip(weights, layers))
        return self.gamma * mixed  # (n, t, d)


class Estimator(nn.Module):
    """The feed-forward head: Linear, activation, dropout per hidden size, then a Linear to one value (and a final
    activation where the model has one). ``ff`` is a Sequential so that its indices match COMET's keys."""

    def __init__(self, in_dim: int, hidden_sizes: list[int], activation: str, final_activation: Optional[str],
                 dropout: float):
        super().__init__()
        layers, width = [], in_dim
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), activation_module(activation), nn.Dropout(dropout)]
            width = size
        layers.append(nn.Linear(width, 1))
        if final_activation:
            layers.append(activation_module(final_activation))
        self.ff = nn.Sequential(*layers)

    def forward(self, features: Tensor) -> Tensor:
        return self.ff(features).view(-1)  # (n,)


def activation_module(name: str) -> nn.Module:
    if str(name).lower() not in ACTIVATIONS:
        raise ValueError(f"COMET hparams.yaml: activation {name!r} is not one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[str(name).lower()]()


class Encoder(nn.Module):
    """Holds the ``transformers`` model as ``model`` (the checkpoint's keys are ``encoder.model.*``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


class CometRegression(nn.Module):
    """COMET's regression model (module docstring): sentence embeddings of source, hypothesis and reference, their
    six features, the estimator."""

    def __init__(self, encoder: nn.Module, hparams: dict, hidden_size: int, n_layers: int, pad_id: int):
        super().__init__()
        self.encoder = Encoder(encoder)
        self.layer = hparams.get("layer", "mix")
        self.pool = hparams.get("pool", "avg")
        self.pad_id = pad_id
        self.layerwise_attention = (LayerMix(n_layers, bool(hparams.get("layer_norm", False)))
                                    if self.layer == "mix" else None)
        self.estimator = Estimator(6 * hidden_size, list(hparams.get("hidden_sizes", [3072, 1024])),
                                   hparams.get("activations", "Tanh"), hparams.get("final_activation"),
                                   float(hparams.get("dropout", 0.1)))

    def embed(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(n, d) sentence embeddings of token ids (n, t) with attention mask (n, t)."""
        layers = self.encoder.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        e = self.layerwise_attention(layers, mask) if self.layerwise_attention is not None else layers[self.layer]
        if self.pool == "cls":
            return e[:, 0]
        pad = (ids == self.pad_id).unsqueeze(-1)  # (n, t, 1)
        if self.pool == "max":
            return e.masked_fill(pad, float("-inf")).max(dim=1).values
        return e.masked_fill(pad, 0.0).sum(1) / mask.sum(1, keepdim=True).to(e.dtype)  # avg

    def forward(self, src: tuple[Tensor, Tensor], mt: tuple[Tensor, Tensor], ref: tuple[Tensor, Tensor]) -> Tensor:
        x_src, x_mt, x_ref = self.embed(*src), self.embed(*mt), self.embed(*ref)
        features = torch.cat([x_mt, x_ref, x_mt * x_ref, (x_mt - x_ref).abs(), x_mt * x_src, (x_mt - x_src).abs()],
                             dim=1)  # (n, 6d)
        return self.estimator(features)


def read_hparams(model_dir: Path) -> dict:
    """MODEL/hparams.yaml as a plain dict (yaml.safe_load), checked: a regression metric with a pooling and a layer
    this reader knows; errors name the file and the key."""
    import yaml

    path = model_dir / HPARAMS
    if not path.is_file():
        raise ValueError(f"metric.comet.model={model_dir}: no {HPARAMS} there (a COMET model directory holds "
                         f"{HPARAMS} and {CHECKPOINT})")
    try:
        hparams = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not readable YAML: {error}") from None
    if not isinstance(hparams, dict):
        raise ValueError(f"{path}: expected a mapping of settings, found {type(hparams).__name__}")
    kind = hparams.get("class_identifier", SUPPORTED_CLASS)
    if kind != SUPPORTED_CLASS:
        raise ValueError(f"{path}: class_identifier {kind!r}: only COMET's {SUPPORTED_CLASS!r} models (source, "
                         f"hypothesis and reference, e.g. wmt22-comet-da) are read here")
    if hparams.get("pool", "avg") not in POOLS:
        raise ValueError(f"{path}: pool {hparams.get('pool')!r} is not one of {', '.join(POOLS)}")
    layer = hparams.get("layer", "mix")
    if layer != "mix" and not isinstance(layer, int):
        raise ValueError(f"{path}: layer {layer!r}: give mix or a layer number")
    if hparams.get("layer_transformation", "softmax") not in ("softmax", "sparsemax_patch"):
        raise ValueError(f"{path}: layer_transformation {hparams.get('layer_transformation')!r}: only softmax is "
                         f"read here")  # sparsemax_patch: COMET >= 2.2.4 reads it as softmax (its issue 244)
    return hparams


def read_weights(model_dir: Path) -> dict[str, Tensor]:
    """The state dict of MODEL/checkpoints/model.ckpt, read with ``weights_only=True`` (a Lightning checkpoint's
    ``state_dict``, or a plain state dict)."""
    path = model_dir / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"metric.comet.model={model_dir}: no {CHECKPOINT} there")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # an unpickling refusal names the object it would have built
        raise ValueError(f"{path}: not readable as weights alone (torch.load weights_only=True): "
                         f"{str(error).splitlines()[0]}") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state dict of tensors (or a checkpoint with one under 'state_dict')")
    return state


def encoder_dir(options: CometOptions, model_dir: Path) -> Path:
    path = Path(options.encoder) if options.encoder else model_dir / "encoder"
    if not (path / "config.json").is_file():
        raise ValueError(f"metric.comet.encoder={options.encoder or 'null'}: {path} holds no config.json; give the "
                         f"local directory of the encoder's config and tokenizer (e.g. xlm-roberta-large's "
                         f"config.json and tokenizer files) with metric.comet.encoder=DIR")
    return path


def load(options: CometOptions, device: torch.device):
    """(model in eval mode on ``device``, tokenizer, max tokens per sentence, hparams) from the local directories
    of ``options``."""
    try:
        from transformers import AutoConfig, AutoModel, AutoTokenizer
    except ImportError:
        raise ValueError("metric comet needs transformers: pip install \"transformer_nmt[hf]\"") from None
    if not options.model:
        raise ValueError("metric comet needs metric.comet.model=DIR, a local COMET model directory (hparams.yaml, "
                         "checkpoints/model.ckpt)")
    model_dir = Path(options.model)
    hparams, state = read_hparams(model_dir), read_weights(model_dir)
    encoder_path = encoder_dir(options, model_dir)
    config = AutoConfig.from_pretrained(encoder_path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(encoder_path, local_files_only=True)
    encoder = AutoModel.from_config(config, add_pooling_layer=False)
    model = CometRegression(encoder, hparams, config.hidden_size, config.num_hidden_layers + 1,
                            tokenizer.pad_token_id)
    state = {k: v for k, v in state.items() if k not in IGNORED_KEYS and not k.endswith("position_ids")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"{model_dir / CHECKPOINT} does not fit the model its {HPARAMS} and {encoder_path} describe: "
                         f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, unexpected "
                         f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    # COMET cuts each sentence to the encoder's positions less 4 (two reserved, two for <s> and </s>)
    max_tokens = config.max_position_embeddings - 4
    return model.eval().to(device), tokenizer, max_tokens, hparams


@register
class Comet(Metric):
    """COMET from a local model directory (module docstring); the mean of the sentences' values, higher better."""

    name, higher_is_better, needs_sources, Options = "comet", True, True, CometOptions
    digits = 4  # values near 0..1
    title = "COMET"

    def __init__(self, options=None, tgt_lang: Optional[str] = None):
        super().__init__(options, tgt_lang)
        self._loaded = None  # (model, tokenizer, max tokens, hparams, signature), on first use

    def check(self) -> None:
        if not self.options.model:
            raise ValueError("metric comet needs metric.comet.model=DIR, a local COMET model directory (hparams.yaml, "
                             "checkpoints/model.ckpt)")
        model_dir = Path(self.options.model)
        read_hparams(model_dir)
        if not (model_dir / CHECKPOINT).is_file():
            raise ValueError(f"metric.comet.model={model_dir}: no {CHECKPOINT} there")
        encoder_dir(self.options, model_dir)

    def device(self) -> torch.device:
        if self.options.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.options.device)

    def loaded(self):
        if self._loaded is None:
            model, tokenizer, max_tokens, hparams = load(self.options, self.device())
            self._loaded = (model, tokenizer, max_tokens, hparams, self.make_signature(hparams))
        return self._loaded

    def make_signature(self, hparams: dict) -> str:
        import transformers

        checkpoint = Path(self.options.model) / CHECKPOINT
        return (f"nrefs:1|model:{Path(self.options.model).resolve().name}|ckpt-sha256:"
                f"{content_digest(checkpoint)[:16]}|encoder:{hparams.get('pretrained_model', '?')}|"
                f"pool:{hparams.get('pool', 'avg')}|layer:{hparams.get('layer', 'mix')}|"
                f"transformers:{transformers.__version__}|reader:transformer_nmt")

    @torch.inference_mode()
    def sentence_values(self, hypotheses: list[str], references: list[str], sources: list[str]) -> list[float]:
        """One value per sentence, in order."""
        model, tokenizer, max_tokens, _, _ = self.loaded()
        device = next(model.parameters()).device
        values = []
        for start in range(0, len(hypotheses), self.options.batch_size):
            window = slice(start, start + self.options.batch_size)
            inputs = []
            for texts in (sources[window], hypotheses[window], references[window]):
                batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_tokens,
                                  return_tensors="pt")
                inputs.append((batch["input_ids"].to(device), batch["attention_mask"].to(device)))
            values += model(*inputs).float().cpu().tolist()
        return values

    def compute(self, hypotheses: list[str], references: list[str],
                sources: Optional[list[str]] = None) -> MetricResult:
        self.check_inputs(hypotheses, references, sources)
        if not hypotheses:
            raise ValueError("metric comet: no sentences to score")
        values = self.sentence_values(hypotheses, references, sources)
        value = math.fsum(values) / len(values)
        return MetricResult(value, self.loaded()[4])
