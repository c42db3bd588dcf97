"""A tiny corpus cut from the bundled Multi30k, and composed configs of conf/train.yaml: one that trains a tiny
model on that corpus in seconds (``tiny_config``), and the plain composition (``compose_train``)."""

import gzip
from pathlib import Path

from hydra import compose, initialize_config_dir

from transformer_nmt.conf import CONF_DIR
from transformer_nmt.training.config import register_configs

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO / "data" / "multi30k"


def multi30k_lines(lang: str, n: int, split: str = "train") -> list[str]:
    """The first ``n`` lines of a bundled Multi30k split, one language, each with its newline."""
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f) for _ in range(n)]


def write_tiny_corpus(directory: Path, n_train: int = 120, n_eval: int = 24) -> Path:
    """The first pairs of Multi30k as plain-text PREFIX.en / PREFIX.de files; returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, source, n in (("train", "train", n_train), ("val", "val", n_eval), ("test", "test_2016_flickr", n_eval)):
        for lang in ("en", "de"):
            (directory / f"{split}.{lang}").write_text("".join(multi30k_lines(lang, n, source)), encoding="utf-8")
    return directory


def write_train_slices(directory: Path, **slices: tuple[int, int]) -> Path:
    """Multi30k's training pairs [start, end) as plain-text NAME.en / NAME.de files, a pair of files per slice
    (``a=(0, 400), val=(400, 450)``); returns ``directory``."""
    end = max(stop for _, stop in slices.values())
    for lang in ("en", "de"):
        lines = multi30k_lines(lang, end)
        for name, (start, stop) in slices.items():
            (directory / f"{name}.{lang}").write_text("".join(lines[start:stop]), encoding="utf-8")
    return directory


def tiny_overrides(corpus: Path) -> list[str]:
    """Command-line overrides of conf/train.yaml: the tiny model on the tiny corpus, quiet, on one CPU, in fp32
    named explicitly: tests compare runs' weights, and trainer.precision=auto would make that comparison depend
    on the CPU's flags (bf16-mixed on a CPU with native bf16)."""
    return [
        "model=tiny", "data=local", f"data.train={corpus}/train", f"data.val={corpus}/val", f"data.test={corpus}/test",
        f"data.cache_dir={corpus}/cache", "data.vocab_size=256", "data.max_tokens=512", "data.num_proc=1",
        "trainer=cpu", "trainer.precision=32-true", "trainer.enable_progress_bar=false", "trainer.max_epochs=-1",
        "trainer.log_every_n_steps=1",
        "train.warmup_steps=20", "train.lr_factor=1.0", "train.val_bleu_max_sentences=8",
        "train.test_bleu_max_sentences=8", "run_test=false", "attention_maps.every_n_validations=0",
    ]


def tiny_config(corpus: Path, *overrides: str):
    """conf/train.yaml with ``tiny_overrides``, and ``overrides`` on top."""
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=tiny_overrides(corpus) + list(overrides))


def compose_train(*overrides: str):
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides))
