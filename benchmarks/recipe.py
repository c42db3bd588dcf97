"""The recipe's small model and its training settings, for the benchmarks (run as ``python benchmarks/X.py``, which
puts benchmarks/ on sys.path): conf/train.yaml with model=small, composed from the package's configs as the app
composes them, so that a benchmark measures the model and optimizer a run trains, not a copy of their numbers."""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from transformer_nmt.conf import CONF_DIR


@cache
def small_recipe(experiment: str | None = None, overrides: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """(model config with vocab_size: TransformerConfig's fields; train config: the ``train:`` node): model=small
    with conf/train.yaml's defaults, or, with ``experiment``, what ``experiment=NAME`` composes (its model, its
    data.vocab_size, its train node; e.g. multi30k_tiny); ``overrides`` composed on top (a Table 3 cell's)."""
    from hydra import compose, initialize_config_dir

    from transformer_nmt.training.config import register_configs
    from transformer_nmt.training.resolvers import register_resolvers

    register_configs()  # conf/train.yaml composes over the schemas
    register_resolvers()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={experiment}" if experiment else "model=small", *overrides])
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("_target_", None)
    return {**model, "vocab_size": cfg.data.vocab_size}, OmegaConf.to_container(cfg.train, resolve=True)


def recipe_adam(parameters, lr: float = 1e-4) -> torch.optim.Adam:
    """Adam with the recipe's betas and eps (paper 5.3) at a fixed ``lr`` (the schedule does not change a step's
    cost)."""
    train = small_recipe()[1]
    return torch.optim.Adam(parameters, lr=lr, betas=tuple(train["betas"]), eps=train["eps"])


def train_step(model, optimizer, src, tgt, autocast) -> None:
    """One plain training step of a bare model (no Lightning): forward under ``autocast()``, the label-smoothed
    loss of the recipe (eps_ls 0.1; pad 0 ignored), backward, ``optimizer``'s step. src (B, S), tgt (B, T + 1)."""
    with autocast():
        logits = model(src, tgt[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), ignore_index=0,
                               label_smoothing=0.1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
