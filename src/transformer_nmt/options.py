"""key=value command-line options, as Hydra writes them, for the commands that read a checkpoint
(``translate``, ``evaluate``, ``export``, ``analyze_heads``)."""

from __future__ import annotations

from omegaconf import OmegaConf


def parse_options(argv: list[str], defaults: dict) -> dict:
    """key=value command-line options over ``defaults``; an unknown key is an error naming it, and so is a
    missing ``ckpt`` (or ``model_dir``, where the command takes one)."""
    given = OmegaConf.to_container(OmegaConf.from_cli(argv))
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise SystemExit(f"unknown option(s) {unknown}; known: {', '.join(defaults)}")
    options = {**defaults, **given}
    if "ckpt" in defaults and not options.get("ckpt") and not options.get("model_dir"):
        alternative = " or model_dir=DIR (written by python -m transformer_nmt.export)" if "model_dir" in defaults else ""
        raise SystemExit(f"missing ckpt=PATH (a checkpoint written by python -m transformer_nmt.train){alternative}")
    return options
