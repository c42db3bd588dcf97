"""How much longer subword regularization makes the training text (``data.spm_alpha``): the pieces of each training
sentence in its deterministic segmentation against one sampled segmentation per alpha, each side of a corpus.

    python studies/segmentation_length.py tokenizer=data/cache/spm-HASH/spm.model "alphas=[0.02,0.05,0.1,0.2]" \\
        out=docs/quality/segmentation_length.json

``tokenizer``: a SentencePiece model (a run's data cache, or a checkpoint's tokenizer written out); ``train``: the
corpus prefix (PREFIX.SRC_LANG and PREFIX.TGT_LANG, ``.gz`` too, one sentence a line). Each alpha
samples the whole side once, the way a training epoch does (data/subword_sampling.py: BPE-dropout seeded from (seed,
epoch 0, side, sentence)). Writes ``out`` (JSON: per alpha and language, the pieces in all,
their ratio to the deterministic count, the share of sentences whose sample is their deterministic segmentation,
the tokenizer's SHA-256, the provenance) and prints a table.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from study_steps import parallel_lines  # studies/: reading PREFIX.SRC / PREFIX.TGT as training does

from transformer_nmt.data.subword_sampling import side_seed
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"tokenizer": None, "train": "data/multi30k/train", "src_lang": "en", "tgt_lang": "de",
           "alphas": [0.02, 0.05, 0.1, 0.2], "seed": 1234, "out": "segmentation_length.json"}
USAGE = "python studies/segmentation_length.py tokenizer=SPM.model [train=PREFIX] [alphas=[...]] [out=FILE.json]"


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["tokenizer"]:
        raise SystemExit("give tokenizer=SPM.model: the SentencePiece model whose segmentations are counted")
    bad = [a for a in options["alphas"] if not isinstance(a, int | float) or not 0 < a < 1]
    if bad:
        raise SystemExit(f"alphas={options['alphas']}: each must be a probability in (0, 1); not {bad}")
    path = Path(options["tokenizer"])
    if not path.is_file():
        raise SystemExit(f"tokenizer={path}: no such file")
    sides = dict(zip((options["src_lang"], options["tgt_lang"]),
                     parallel_lines(options["train"], options["src_lang"], options["tgt_lang"])))  # read first
    tokenizer = Tokenizer.load(path)
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    rows = []
    for lang, texts in sides.items():
        target = lang == options["tgt_lang"]
        plain = tokenizer.encode_batch(texts, target=target)
        pieces = sum(map(len, plain))
        seed = side_seed(options["seed"], 0, target)  # epoch 0's draws of this side, as a training run's
        for alpha in options["alphas"]:
            sampled = tokenizer.encode_sampled(texts, alpha, seed, target=target)
            total = sum(map(len, sampled))
            rows.append({"lang": lang, "alpha": alpha, "sentences": len(texts), "pieces_deterministic": pieces,
                         "pieces_sampled": total, "ratio": round(total / pieces, 4),
                         "unchanged_share": round(sum(a == b for a, b in zip(plain, sampled)) / len(texts), 4)})
    result = {"options": options, "tokenizer_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "rows": rows,
              PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(rows))
    return result


def markdown(rows: list[dict]) -> str:
    lines = ["| language | alpha | pieces, deterministic | pieces, sampled | ratio | sentences unchanged |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['lang']} | {r['alpha']:g} | {r['pieces_deterministic']:,} | {r['pieces_sampled']:,} | "
              f"{r['ratio']:.3f} | {100 * r['unchanged_share']:.1f}% |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
