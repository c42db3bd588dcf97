"""The MarianMT export's proof at full size: a checkpoint exported and run by transformers against our own
code on the first ``n`` Multi30k validation sentences (the proofs tests/test_marian.py runs on 24).

    python studies/marian_exactness.py ckpt=RUN/checkpoints/last.ckpt [n=300] [out=DIR] [threads=2]

Rows: teacher-forced logits (max |ours - transformers'| over every scored position and the whole vocabulary,
fp32); greedy search (ids identical line for line, our length limit applied to transformers' output, which has
one limit for the batch; and the text through MarianTokenizer's ``batch_decode(skip_special_tokens=True)``, what
``pipeline("translation")`` returned before transformers 5 removed it, on the lines that end before our limit);
beam 4 at alpha 0, where the length penalties agree (identical hypotheses, and scores within 1e-4 for those that end
before our limit); beam 4 with
our GNMT penalty at our alpha against transformers' |Y|^length_penalty at the exported length_penalty and at 1.0
(lines identical and sacreBLEU of each against the references). Prints a markdown table; writes it with the raw
numbers (``exactness.json``) and every hypothesis file to ``out`` (default: a temporary directory, kept).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.search import max_output_lengths
from transformer_nmt.inference.evaluate import score
from transformer_nmt.inference.translate import read_lines, translate_ids
from transformer_nmt.interchange.marian import export_marian, import_transformers
from transformer_nmt.options import parse_options

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"ckpt": None, "n": 300, "out": None, "threads": 2, "batch": 50,
           "src": str(ROOT / "data/multi30k/val.en.gz"), "ref": str(ROOT / "data/multi30k/val.de.gz")}
TOLERANCE = 1e-4


def padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(r) for r in rows], batch_first=True, padding_value=pad)


def cut(rows: list[list[int]], limits: list[int], eos: int, drop: tuple[int, ...]) -> list[list[int]]:
    """transformers' generated ids (start token removed) cut at our limit and at eos, specials dropped."""
    out = []
    for row, limit in zip(rows, limits):
        row = row[:limit]
        row = row[: row.index(eos)] if eos in row else row
        out.append([t for t in row if t not in drop])
    return out


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__)
    if not options["ckpt"]:
        raise SystemExit("give ckpt=PATH (a checkpoint; e.g. python -m transformer_nmt.train experiment=smoke writes "
                         "outputs/smoke/RUN/checkpoints/last.ckpt)")
    torch.set_num_threads(options["threads"])
    transformers = import_transformers()
    out_dir = Path(options["out"] or tempfile.mkdtemp(prefix="marian_exactness_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer, meta = load_checkpoint(options["ckpt"])
    directory = export_marian(model, tokenizer, out_dir / "marian", meta, force=True,
                              command="python studies/marian_exactness.py " + " ".join(argv))
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    generation = hf_model.generation_config
    sources, references = read_lines(options["src"])[: options["n"]], read_lines(options["ref"])[: options["n"]]
    pad, eos, bos, offset = tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id, DecodeConfig().max_len_offset

    rows, raw = [], {"checkpoint": options["ckpt"], "sentences": len(sources), "transformers": transformers.__version__,
                     "torch_threads": torch.get_num_threads()}
    max_diff = 0.0
    batches = [range(i, min(i + options["batch"], len(sources))) for i in range(0, len(sources), options["batch"])]
    for batch in batches:
        enc = hf_tokenizer([sources[i] for i in batch], text_target=[references[i] for i in batch],
                           return_tensors="pt", padding=True)
        labels = enc["labels"]
        tgt_in = torch.cat([torch.full((len(batch), 1), bos), labels[:, :-1]], dim=1)
        with torch.no_grad():
            theirs = hf_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                              decoder_input_ids=tgt_in).logits
            ours = model(enc["input_ids"], tgt_in)
        max_diff = max(max_diff, (theirs - ours)[labels != pad].abs().max().item())
    raw["logits_max_abs_diff"] = max_diff
    rows.append(("teacher-forced logits, max abs diff (fp32)", f"{max_diff:.2e}",
                 "yes" if max_diff < TOLERANCE else "NO"))

    def ours_search(**changes):
        return translate_ids(model, tokenizer, sources, **changes)

    def theirs_search(src_ids, limits, **kwargs):
        out, scores = [], []
        for batch in batches:
            src = padded([src_ids[i] for i in batch], pad)
            result = hf_model.generate(input_ids=src, attention_mask=src != pad,
                                       max_new_tokens=max(limits[i] for i in batch),
                                       return_dict_in_generate=True, output_scores=True, **kwargs)
            out += cut(result.sequences[:, 1:].tolist(), [limits[i] for i in batch], eos, (pad, bos))
            if getattr(result, "sequences_scores", None) is not None:
                scores += result.sequences_scores.tolist()
        return out, scores

    src_ids, greedy = ours_search(beam=1)
    limits = max_output_lengths(model, padded(src_ids, pad), offset).tolist()
    ours_greedy = [h[0][0] for h in greedy]
    theirs_greedy, _ = theirs_search(src_ids, limits, num_beams=1, do_sample=False)
    same = sum(a == b for a, b in zip(ours_greedy, theirs_greedy))
    rows.append(("greedy: ids identical", f"{same}/{len(sources)}", "yes" if same == len(sources) else "NO"))
    ended = [i for i, ids in enumerate(ours_greedy) if len(ids) < limits[i]]
    texts = []
    for batch in batches:
        enc = hf_tokenizer([sources[i] for i in batch], return_tensors="pt", padding=True)
        texts += hf_tokenizer.batch_decode(hf_model.generate(**enc, num_beams=1), skip_special_tokens=True)
    same_text = sum(texts[i] == tokenizer.decode(ours_greedy[i]) for i in ended)
    rows.append(("greedy: generate + batch_decode text identical (lines ending before our limit)",
                 f"{same_text}/{len(ended)}", "yes" if same_text == len(ended) else "NO"))
    raw.update(greedy_identical=same, greedy_text_identical=same_text, greedy_ended_before_limit=len(ended))

    _, beam0 = ours_search(beam=4, alpha=0.0)
    theirs0, scores0 = theirs_search(src_ids, limits, num_beams=4, length_penalty=0.0, early_stopping="never")
    same0 = sum(h[0][0] == t for h, t in zip(beam0, theirs0))
    # scores of the hypotheses that end before our limit (past it transformers' own, longer one has its score)
    ended0 = [i for i, h in enumerate(beam0) if len(h[0][0]) < limits[i]]
    worst = max(abs(beam0[i][0][1] - scores0[i]) for i in ended0)
    rows.append(("beam 4, alpha 0: hypotheses identical", f"{same0}/{len(sources)}",
                 "yes" if same0 == len(sources) else "NO"))
    rows.append((f"beam 4, alpha 0: max abs score diff ({len(ended0)} ending before our limit)", f"{worst:.2e}",
                 "yes" if worst < TOLERANCE else "NO"))
    raw.update(beam_alpha0_identical=same0, beam_alpha0_max_score_diff=worst, beam_alpha0_ended=len(ended0))

    alpha = DecodeConfig().alpha
    _, beam = ours_search(beam=4, alpha=alpha)
    ours_text = [tokenizer.decode(h[0][0]) for h in beam]
    bleu_ours = score(ours_text, references)
    (out_dir / "ours_beam4.hyp").write_text("".join(t + "\n" for t in ours_text), encoding="utf-8")
    raw["beam4_ours"] = {"alpha": alpha, **bleu_ours}
    rows.append((f"beam 4: ours, GNMT alpha {alpha}: BLEU / chrF", f"{bleu_ours['bleu']:.2f} / {bleu_ours['chrf']:.2f}",
                 "-"))
    for length_penalty in dict.fromkeys([generation.length_penalty, 1.0]):
        theirs, _ = theirs_search(src_ids, limits, num_beams=4, length_penalty=length_penalty, early_stopping="never")
        theirs_text = [tokenizer.decode(ids) for ids in theirs]
        bleu = score(theirs_text, references)
        same = sum(h[0][0] == t for h, t in zip(beam, theirs))
        (out_dir / f"transformers_beam4_lp{length_penalty}.hyp").write_text(
            "".join(t + "\n" for t in theirs_text), encoding="utf-8")
        raw[f"beam4_transformers_lp{length_penalty}"] = {**bleu, "identical_to_ours": same}
        rows.append((f"beam 4: transformers, length_penalty {length_penalty}: BLEU / chrF (lines as ours)",
                     f"{bleu['bleu']:.2f} / {bleu['chrf']:.2f} ({same}/{len(sources)})",
                     f"{bleu['bleu'] - bleu_ours['bleu']:+.2f} BLEU"))

    table = ["| check | result | exact |", "| --- | --- | --- |"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    text = (f"{len(sources)} sentences of {Path(options['src']).name}, checkpoint {options['ckpt']}, transformers "
            f"{transformers.__version__}, {torch.get_num_threads()} torch threads\n\n" + "\n".join(table) + "\n")
    print(text)
    (out_dir / "exactness.md").write_text(text, encoding="utf-8")
    (out_dir / "exactness.json").write_text(json.dumps({**raw, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"written to {out_dir}")
    return raw


if __name__ == "__main__":
    main(sys.argv[1:])
