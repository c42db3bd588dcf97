"""Back-translation (Sennrich et al. 2016), tagged (Caswell et al. 2019), simulated the standard way and measured
(issue 39).

    python studies/back_translation.py experiment=ablation_base "seeds=[1,2]" out=docs/quality/back_translation.json

1. The training split is cut in two: the first ``parallel_fraction`` of its pairs stay parallel (WORK/split/real),
   the rest keep only their target side, as monolingual text (WORK/split/mono.TGT).
2. A model of the reverse direction (target -> source, ``experiment`` with ``reverse_overrides``) trains on the
   real pairs, then translates the monolingual text into synthetic sources (``python -m transformer_nmt.synthesize``:
   beam ``beam``, or sampling with ``sampling=true``, as Edunov et al. 2018 compare): WORK/bt/train.
3. One vocabulary for every forward run: SentencePiece trained on the real and the back-translated pairs, with the
   tag as a piece of its own (WORK/vocabulary.model), so the three corpora differ only in their pairs.
4. The forward direction trains, for each seed, on the real pairs alone, on the real and back-translated pairs,
   and on the same with every back-translated source led by ``tag`` (``data.train=[...]``,
   ``data.train_upsample``, ``data.train_tags``); ``overrides`` go to all three (e.g. a fixed trainer.max_steps
   gives each the same updates).
5. Each forward run's final weights and the reverse model are scored on val and test (beam ``beam``).

Every step is skipped when its output exists: run the same command again and the study goes on where it stopped.
Writes ``out`` (JSON: each run's scores, the means over seeds, the step times, the provenance); the corpora, runs
and evaluations go under ``work`` (default outputs/back_translation/, which git ignores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from study_steps import mean, parallel_lines, run_step, score  # studies/: the steps of a multi-step study

from transformer_nmt.data.tokenizer import train_sentencepiece
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"experiment": "ablation_base", "overrides": [], "reverse_overrides": [], "seeds": [1, 2],
           "train": "data/multi30k/train", "src_lang": "en", "tgt_lang": "de", "parallel_fraction": 0.5,
           "upsample_real": 1, "tag": "<BT>", "vocab_size": 8000, "beam": 5, "sampling": False,
           "splits": ["val", "test"], "out": "back_translation.json", "work": "outputs/back_translation"}
USAGE = "python studies/back_translation.py [experiment=ablation_base] [seeds=[1,2]] [out=FILE.json]"


def split_corpus(options: dict, work: Path) -> tuple[Path, Path]:
    """(prefix of the real pairs, file of the monolingual target text), written once."""
    real, mono = work / "split" / "real", work / "split" / f"mono.{options['tgt_lang']}"
    if mono.exists():
        return real, mono
    src, tgt = parallel_lines(options["train"], options["src_lang"], options["tgt_lang"])
    cut = round(len(src) * float(options["parallel_fraction"]))
    if not 0 < cut < len(src):
        raise SystemExit(f"parallel_fraction={options['parallel_fraction']}: leaves no real or no monolingual half")
    real.parent.mkdir(parents=True, exist_ok=True)
    for lang, lines in ((options["src_lang"], src[:cut]), (options["tgt_lang"], tgt[:cut])):
        Path(f"{real}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    mono.write_text("".join(line + "\n" for line in tgt[cut:]), encoding="utf-8")  # last: it marks the step done
    return real, mono


def vocabulary(options: dict, work: Path, prefixes: list[Path]) -> Path:
    """One SentencePiece model over every pair the forward runs read, holding the tag whole."""
    path = work / "vocabulary.model"
    if not path.exists():
        langs = (options["src_lang"], options["tgt_lang"])
        sentences = [s for prefix in prefixes for side in parallel_lines(prefix, *langs) for s in side if s]
        train_sentencepiece(iter(sentences), options["vocab_size"], user_defined_symbols=[options["tag"]],
                            seed=1234).save(path)
    return path


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    work, src, tgt = Path(options["work"]), options["src_lang"], options["tgt_lang"]
    real, mono = split_corpus(options, work)
    seconds = {}
    reverse = work / "runs" / f"{tgt}_{src}"
    seconds["reverse model"] = run_step("reverse model", reverse / "results.json", [
        "transformer_nmt.train", f"experiment={options['experiment']}", *options["reverse_overrides"],
        f"data.train={real}", f"data.src_lang={tgt}", f"data.tgt_lang={src}", f"hydra.run.dir={reverse}"])
    reverse_ckpt = reverse / "checkpoints" / "last.ckpt"
    bt = work / "bt" / "train"
    search = ["sampling=true", "beam=1"] if options["sampling"] else [f"beam={options['beam']}"]
    seconds["back-translate"] = run_step("back-translate", Path(f"{bt}.{src}"), [
        "transformer_nmt.synthesize", f"ckpt={reverse_ckpt}", f"input={mono}", f"output={bt}", f"src_lang={tgt}",
        f"tgt_lang={src}", *search])
    spm = vocabulary(options, work, [real, bt])
    corpora = {"real": [f"data.train=[{real}]"],
               "real + back-translated": [f"data.train=[{real},{bt}]",
                                          f"data.train_upsample=[{options['upsample_real']},1]"],
               "real + back-translated, tagged": [f"data.train=[{real},{bt}]",
                                                  f"data.train_upsample=[{options['upsample_real']},1]",
                                                  f"data.train_tags=[null,'{options['tag']}']"]}
    runs = []
    for name, data in corpora.items():
        for seed in options["seeds"]:
            run_dir = work / "runs" / name.replace(" + ", "_").replace(", ", "_").replace(" ", "_") / f"seed{seed}"
            step = f"{name}, seed {seed}"
            seconds[step] = run_step(step, run_dir / "results.json", [
                "transformer_nmt.train", f"experiment={options['experiment']}", *options["overrides"], *data,
                f"data.src_lang={src}", f"data.tgt_lang={tgt}", f"data.tokenizer_path={spm}", f"seed={seed}",
                f"hydra.run.dir={run_dir}"])
            runs.append({"corpus": name, "seed": seed, "run_dir": str(run_dir),
                         "scores": score(run_dir / "checkpoints" / "last.ckpt", options["splits"], options["beam"],
                                         work / "eval" / run_dir.relative_to(work / "runs"))})
    means = {name: {split: mean([r["scores"][split]["bleu"] for r in runs if r["corpus"] == name])
                    for split in options["splits"]} for name in corpora}
    result = {"options": options, "pairs": {"real": len(parallel_lines(real, src, tgt)[0]),
                                            "back_translated": len(parallel_lines(bt, src, tgt)[0])},
              "reverse_model": {"run_dir": str(reverse), "scores": score(reverse_ckpt, options["splits"],
                                                                          options["beam"], work / "eval" / "reverse")},
              "runs": runs, "mean_bleu": means, "seconds": seconds, PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, row in means.items():
        print(f"{name}: " + ", ".join(f"{split} BLEU {bleu}" for split, bleu in row.items()))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
