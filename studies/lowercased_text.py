"""A recipe trained on the text the published baselines train on: Multi30k as the ``lc.norm.tok`` files have it
(Moses-normalized, Moses-tokenized, lowercased), against our raw cased text (issue 36).

    python studies/lowercased_text.py experiment=multi30k_tiny run_id=tiny_L out=docs/quality/tiny_L

The published Transformer-Tiny (41.02 on test2016) learns its BPE from, trains on and is scored against the dataset's
lowercased, tokenized files; every recipe here trains SentencePiece on the raw, cased text and is scored after the
fact in that convention (``bleu_multi30k``). This study takes the other road:

1. WORK/corpus/{train,val,test_2016_flickr}.{SRC,TGT}: each line of the bundled files through the same Moses ports
   that score the convention (inference/multi30k_bleu.moses_tokenized: sacremoses' punctuation normalizer and
   tokenizer), then lowercased; one line out per line in, counted.
2. ``python -m transformer_nmt.reproduce experiment=EXPERIMENT run_dir=WORK/RUN_ID`` on those files (``data.train``,
   ``data.val``, ``data.test``; ``overrides`` after them): the recipe's vocabulary (SentencePiece BPE of its
   ``data.vocab_size``) is learnt on the lowercased text, the run trains, averages, chooses on val and scores test
   against the lowercased, tokenized references. Its ``bleu_multi30k`` is the convention's number (tokenizing the
   tokenized German again changes no line of val); its cased scores are of lowercased text and mean nothing.
   Running the command again resumes the run where it stopped (the run directory's last checkpoint).
3. Copies the run's reproduce.json and results.json to OUT_reproduce.json and OUT_results.json and writes
   OUT_corpus.json: how the corpus was made (sacremoses' version, each file's lines and sha256).

The corpus and the run go under ``work`` (default outputs/lowercased_text/, which git ignores).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import sys
from pathlib import Path

from study_steps import parallel_lines, run_step  # studies/: the steps of a multi-step study

from transformer_nmt.durable import atomic_write
from transformer_nmt.inference.multi30k_bleu import moses_tokenized
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"experiment": "multi30k_tiny", "run_id": "lowercased", "overrides": [], "data": "data/multi30k",
           "splits": ["train", "val", "test_2016_flickr"], "src_lang": "en", "tgt_lang": "de",
           "out": "lowercased_text", "work": "outputs/lowercased_text"}
USAGE = "python studies/lowercased_text.py [experiment=multi30k_tiny] [run_id=NAME] [out=PREFIX]"


def lowercased_tokenized(lines: list[str], lang: str) -> list[str]:
    """The ``lc.norm.tok`` form of each line: Moses-normalized, Moses-tokenized for ``lang``, lowercased."""
    return [line.lower() for line in moses_tokenized(lines, lang)]


def write_corpus(data: Path, corpus: Path, splits: list[str], langs: tuple[str, str]) -> dict:
    """Each split's PREFIX.{SRC,TGT} under ``data`` in its lc.norm.tok form under ``corpus``; what was written
    (lines and sha256 per file). A split whose two files exist already is kept as it is."""
    corpus.mkdir(parents=True, exist_ok=True)
    files = {}
    for split in splits:
        outputs = [corpus / f"{split}.{lang}" for lang in langs]
        if not all(path.exists() for path in outputs):
            for lang, lines, path in zip(langs, parallel_lines(data / split, *langs), outputs):
                text = "".join(line + "\n" for line in lowercased_tokenized(lines, lang))
                atomic_write(path, lambda f, text=text: f.write(text.encode("utf-8")))
        for path in outputs:
            text = path.read_bytes()
            files[path.name] = {"lines": text.count(b"\n"), "sha256": hashlib.sha256(text).hexdigest()}
    return files


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    langs = (options["src_lang"], options["tgt_lang"])
    corpus = Path(options["work"]) / "corpus"
    files = write_corpus(Path(options["data"]), corpus, options["splits"], langs)
    train, val, test = (str(corpus / split) for split in options["splits"])
    run_dir = Path(options["work"]) / options["run_id"]
    command = ["transformer_nmt.reproduce", f"experiment={options['experiment']}", f"run_dir={run_dir}",
               f"run_id={options['run_id']}",
               f"data.src_lang={langs[0]}", f"data.tgt_lang={langs[1]}",
               f"data.train={train}", f"data.val={val}", f"data.test={test}", *options["overrides"]]
    seconds = run_step("reproduce", run_dir / "reproduce.json", command)
    out = Path(options["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    for kind in ("reproduce", "results"):
        shutil.copyfile(run_dir / f"{kind}.json", f"{out}_{kind}.json")
    record = {"options": options, "corpus": str(corpus), "files": files, "run_dir": str(run_dir),
              "moses": f"sacremoses-{importlib.metadata.version('sacremoses')}", "reproduce_seconds": seconds,
              PROVENANCE_KEY: provenance}
    Path(f"{out}_corpus.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    scores = json.loads((run_dir / "reproduce.json").read_text())["scores"]
    print(", ".join(f"{key}: BLEU {value.get('bleu_multi30k')} in the Multi30k convention"
                    for key, value in scores.items()))
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
