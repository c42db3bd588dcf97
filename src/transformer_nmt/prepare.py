"""Prepare the data without training: vocabulary, tokenized caches, corpus statistics.

    python -m transformer_nmt.prepare                      # bundled Multi30k, en->de
    python -m transformer_nmt.prepare data=local data.train=corpus/train data.val=... data.test=...
    python -m transformer_nmt.prepare data=wmt14_en_de

Uses the same ``data`` config as training, so the caches it builds are the ones training reuses.
"""

from __future__ import annotations

import time

import hydra
import numpy as np
from omegaconf import DictConfig

from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.training.config import register_configs
from transformer_nmt.training.resolvers import register_resolvers

register_configs()  # conf/prepare.yaml composes over the schemas (DataConfig; --help lists its options)
register_resolvers()  # before Hydra composes: the data group's files may use them, as train.yaml's do


def split_statistics(dm: TranslationDataModule, split: str) -> dict:
    """Pairs, tokens and length percentiles of a filtered split, and its batches at ``max_tokens``."""
    s = dm.splits[split]
    stats = {"pairs": s.report.total, "kept": s.report.kept, "filter": str(s.report)}
    lengths = {side: s.lengths(lang) for side, lang in (("src", dm.src_lang), ("tgt", dm.tgt_lang))}  # (n_kept,)
    for side, lang in (("src", dm.src_lang), ("tgt", dm.tgt_lang)):
        stats[side] = {"lang": lang, "tokens": int(lengths[side].sum()),
                       "percentiles": dict(zip((50, 90, 99, 100), np.percentile(lengths[side], (50, 90, 99, 100))))}
    sampler = dm.batch_sampler(split)
    batches = sampler.epoch_batches(0)
    sizes = np.array([len(b) for b in batches])  # (n_batches,)
    flat = np.concatenate(batches)  # (n_kept,) pair indices, batch after batch
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    padded = int((sizes * np.maximum.reduceat(np.asarray(sampler.widths)[flat], starts).astype(np.int64)).sum())
    real = int(lengths["tgt"][flat].sum(dtype=np.int64)) + 2 * len(flat)  # bos + target + eos
    stats["batches"] = {"count": len(batches), "max_tokens": sampler.max_tokens,
                        "mean_pairs": float(sizes.mean()), "target_fill": real / padded}
    return stats


def format_statistics(dm: TranslationDataModule, elapsed: float) -> str:
    tok = dm.tokenizer
    vocab = (f"vocabulary: {tok.vocab_size} pieces ({dm.vocab_options['model_type']}), "
             f"{'trained' if dm.tokenizer_trained_now else 'reused'}: {dm.tokenizer_path_used}"
             f"\n  ids: pad={tok.pad_id} unk={tok.unk_id} bos={tok.bos_id} eos={tok.eos_id}")
    lines = [f"corpus: {dm.spec.format} {dm.src_lang}->{dm.tgt_lang}, cache {dm.cache_dir}", vocab]
    header = (f"{'split':6} {'pairs':>9} {'kept':>9} {'side':4} {'tokens':>11} "
              f"{'p50':>5} {'p90':>5} {'p99':>5} {'max':>5}")
    lines.append(header)
    stats = {split: split_statistics(dm, split) for split in dm.splits}
    for split, st in stats.items():
        for side in ("src", "tgt"):
            p = st[side]["percentiles"]
            first = f"{split:6} {st['pairs']:9d} {st['kept']:9d}" if side == "src" else " " * 26
            lines.append(f"{first} {st[side]['lang']:4} {st[side]['tokens']:11d} "
                         + " ".join(f"{p[q]:5.0f}" for q in (50, 90, 99, 100)))
    lines.append("filtering (token lengths, bos/eos excluded):")
    lines += [f"  {dm.splits[split].report}" for split in dm.splits]
    lines.append("batches per epoch (one process):")
    for split in dm.splits:
        b = stats[split]["batches"]
        lines.append(f"  {split}: {b['count']} batches of <= {b['max_tokens']} tokens per side, "
                     f"{b['mean_pairs']:.0f} pairs on average, target fill {b['target_fill']:.0%}")
    tokenized = [s for s in dm.splits if dm.splits[s].tokenized_now]
    lines.append(f"tokenized now: {', '.join(tokenized) or 'nothing (all splits from cache)'}; {elapsed:.1f}s")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="conf", config_name="prepare")
def main(cfg: DictConfig) -> None:
    start = time.perf_counter()
    dm = TranslationDataModule(cfg.data)
    dm.setup()
    print(format_statistics(dm, time.perf_counter() - start))


if __name__ == "__main__":
    main()
