"""Terminology by lexical constraints on Multi30k test_2016_flickr (en->de): BLEU without and with constraints
drawn from the reference, the share of constraints met, and the speed cost of the constrained beam.

    python studies/constrained_terminology.py ckpt=CKPT out=docs/evaluation/constrained_terminology.json
    python studies/constrained_terminology.py train_demo=demo.ckpt    # the demonstration model (~10 min, 1 thread)

The terminology rule (a stand-in for a term base: words the translation should contain and the model misses):
for each sentence, the reference's words (split on spaces, leading and trailing punctuation stripped) of at least
``min_chars`` characters that are not a word of the unconstrained output (case-sensitive), longest first (ties:
the earlier), at most ``words`` of them; a sentence with none gets no constraint (a blank constraint line). Both
decodes are ``python -m transformer_nmt.translate`` as a user runs it (the constrained one with
``constraints=FILE``), at the decoding defaults (beam 4, length penalty 0.6), timed whole (model load included, a
few milliseconds for a small model), ``rounds`` times each, alternating, the median kept. A constraint is met when
its word is a word of the output. BLEU: sacreBLEU's corpus BLEU (13a, cased) against the reference. Writes
``out`` (JSON: the options, the rule, the numbers, per sentence the constraints and both outputs, provenance)
and prints the numbers; scripts/docs_tables.py writes docs/evaluation.md's table from that file.

``train_demo=PATH`` writes the demonstration model docs/evaluation.md's table comes from and exits: plain torch
on one thread (tests/tiny_checkpoint.py's ``train_checkpoint``: Adam 3e-3, no label smoothing, no dropout), all
29,000 training pairs, a 2,000-piece SentencePiece vocabulary, 2+2 layers of d_model 128, 450 steps of 64 pairs.

Drawn from the reference, the constraints put reference words into the output: the BLEU gain is an upper
bound of what a term base gives, not a quality claim; the point is that every constraint is met.
"""

from __future__ import annotations

import json
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

from transformer_nmt.inference.translate import main as translate
from transformer_nmt.inference.translate import read_lines
from transformer_nmt.metrics import catalog
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"
OPTIONS = {"ckpt": None, "train_demo": None, "out": "constrained_terminology.json", "split": "test_2016_flickr",
           "words": 2, "min_chars": 4, "limit": 0, "rounds": 1}
USAGE = ("python studies/constrained_terminology.py ckpt=CKPT [out=FILE.json] [words=2] [min_chars=4] [limit=0] "
         "[rounds=1]")


def words_of(text: str) -> list[str]:
    """The words of ``text``: split on spaces, leading and trailing punctuation stripped, empty ones dropped."""
    return [w for w in (word.strip(string.punctuation + "„“”‚‘’«»") for word in text.split()) if w]


def terminology(reference: str, output: str, words: int, min_chars: int) -> list[str]:
    """The rule above: up to ``words`` reference words of ``min_chars`` or more characters missing from
    ``output``, longest first, ties in reference order, each once."""
    have = set(words_of(output))
    missing = []
    for word in words_of(reference):
        if len(word) >= min_chars and word not in have and word not in missing:
            missing.append(word)
    return sorted(missing, key=lambda w: -len(w))[:words]  # sorted() is stable: ties keep the reference order


def train_demo(path: str) -> None:
    """The demonstration model (module docstring): minutes on one CPU thread, not the recipe."""
    import torch

    sys.path.insert(0, str(DATA.parent.parent / "tests"))
    from tiny_checkpoint import multi30k_lines, train_checkpoint

    from transformer_nmt.data.tokenizer import train_sentencepiece

    torch.set_num_threads(1)
    pairs = 29000
    tokenizer = train_sentencepiece(iter(multi30k_lines("train", "en", pairs) + multi30k_lines("train", "de", pairs)),
                                    vocab_size=2000)
    train_checkpoint(path, tokenizer, steps=450, n_pairs=pairs, batch_size=64, seed=0, d_model=128, n_heads=4,
                     n_encoder_layers=2, n_decoder_layers=2, d_ff=256)


def timed_translate(args: list[str], output: Path) -> tuple[float, list[str]]:
    start = time.perf_counter()
    translate([*args, f"output={output}"])
    return time.perf_counter() - start, output.read_text(encoding="utf-8").splitlines()


def model_summary(ckpt: str) -> dict:
    """What the checkpoint records of itself: its model settings and its optimizer steps."""
    from transformer_nmt.checkpoint import load_checkpoint

    model, _, meta = load_checkpoint(ckpt)
    return {"config": model.config.to_dict(), "global_step": meta.get("global_step"),
            "parameters": sum(p.numel() for p in model.parameters())}


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if options["train_demo"]:
        train_demo(options["train_demo"])
        return {}
    if not options["ckpt"]:
        raise SystemExit("give ckpt=CKPT: a checkpoint trained on Multi30k en->de")
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    sources = read_lines(DATA / f"{options['split']}.en.gz")
    references = read_lines(DATA / f"{options['split']}.de.gz")
    if options["limit"]:
        sources, references = sources[: options["limit"]], references[: options["limit"]]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "in.en").write_text("".join(line + "\n" for line in sources), encoding="utf-8")
        plain_args = [f"ckpt={options['ckpt']}", f"input={tmp / 'in.en'}"]
        plain_seconds, plain = timed_translate(plain_args, tmp / "plain.de")
        constraints = [terminology(r, o, options["words"], options["min_chars"]) for r, o in zip(references, plain)]
        (tmp / "terms.tsv").write_text("".join("\t".join(c) + "\n" for c in constraints), encoding="utf-8")
        constrained_args = [*plain_args, f"constraints={tmp / 'terms.tsv'}"]
        constrained_seconds, constrained = timed_translate(constrained_args, tmp / "constrained.de")
        plain_times, constrained_times = [plain_seconds], [constrained_seconds]
        for _ in range(options["rounds"] - 1):
            plain_times.append(timed_translate(plain_args, tmp / "plain.de")[0])
            constrained_times.append(timed_translate(constrained_args, tmp / "constrained.de")[0])
    met = [[word in set(words_of(out)) for word in terms] for terms, out in zip(constraints, constrained)]
    n_terms = sum(len(c) for c in constraints)
    metric = catalog.build("bleu")  # the registry's BLEU: sacreBLEU's, 13a, cased
    bleu = {name: metric.compute(hyps, references) for name, hyps in
            (("unconstrained", plain), ("constrained", constrained))}
    unconstrained_lines = [i for i, c in enumerate(constraints) if not c]
    result = {
        "split": options["split"], "sentences": len(sources),
        "rule": f"per sentence up to {options['words']} reference words of >= {options['min_chars']} characters "
                f"missing from the unconstrained output, longest first",
        "decoding": "translate defaults (beam 4, alpha 0.6, gnmt length penalty, max_len_offset 50)",
        "constrained_sentences": len(sources) - len(unconstrained_lines), "constraints": n_terms,
        "constraints_met": sum(map(sum, met)), "share_met": sum(map(sum, met)) / max(n_terms, 1),
        "unconstrained_lines_unchanged": sum(plain[i] == constrained[i] for i in unconstrained_lines),
        "unconstrained_lines": len(unconstrained_lines),
        "bleu": {name: round(b.value, 2) for name, b in bleu.items()},
        "bleu_signature": bleu["constrained"].signature,
        "seconds": {"unconstrained": statistics.median(plain_times),
                    "constrained": statistics.median(constrained_times)},
        "seconds_all": {"unconstrained": plain_times, "constrained": constrained_times},
        "model": model_summary(options["ckpt"]),
        "rows": [{"constraints": c, "unconstrained": p, "constrained": o} for c, p, o in
                 zip(constraints, plain, constrained)],
        PROVENANCE_KEY: provenance,
    }
    result["slowdown"] = result["seconds"]["constrained"] / result["seconds"]["unconstrained"]
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", PROVENANCE_KEY)}, indent=2,
                     ensure_ascii=False))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
