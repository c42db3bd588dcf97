"""Make a corpus with a model: translate a whole source-side corpus into pairs, in shards, resumable.

    python -m transformer_nmt.synthesize ckpt=RUN/checkpoints/averaged.ckpt input=data/multi30k/train.en.gz \
        output=distilled/train                                   # distillation: the teacher's beam output
    python -m transformer_nmt.synthesize ckpt=[A,B] input=mono.de output=bt/train sampling=true   # an ensemble

Writes ``PREFIX.SRC`` and ``PREFIX.TGT`` (SRC, TGT: ``src_lang`` and ``tgt_lang``, by default the checkpoint's data
languages), a parallel corpus that ``data.train=PREFIX`` reads: line i of ``PREFIX.SRC`` is input line i as it is,
line i of ``PREFIX.TGT`` its translation, written as translate writes it (one line: line breaks, tabs and control
characters inside a translation become spaces); a blank input line gives a blank pair (the data's filter drops
it), so the two files keep the input's line count. With ``n_best`` n > 1, each input line gives n pairs, best
first. ``PREFIX.json`` records what made them: each model's path and sha256, the input's path and sha256, the
search, the counts, every launch's shards and seconds, and provenance (commit, versions, machine, command).

Sequence-level knowledge distillation (Kim & Rush 2016): a teacher (a checkpoint, an average, an ensemble)
translates the training sources with beam search, and a student trains on ``PREFIX`` in place of the original
pairs. Back-translation (Sennrich et al. 2016; sampling: Edunov et al. 2018): a target-to-source model translates
target-side monolingual text; its ``PREFIX`` holds that text and its synthetic sources under their languages' own
suffixes, so the forward model reads it with its own ``data.src_lang`` and ``data.tgt_lang``.

The input is cut into shards of ``shard_lines`` lines, each written (atomically: whole or absent) to
``PREFIX.shards/`` as soon as it is translated, with the plan (``plan.json``: input, models, search, shard size)
written first. A run killed in the middle and started again with the same command translates only the shards not
written: no line is translated twice or lost, and a sampled line draws the same sample (its seed is its line
number in the whole input). Another command over the same ``PREFIX.shards/`` (another input, model or search) is
refused, naming what differs; each shard records the plan that made it (``plan_sha256``) and is taken only by
that plan, so shards left without ``plan.json`` (two launches racing on the final cleanup) are translated again,
never taken into another synthesis. Once every shard is there, the outputs are written (atomically) and the shards
removed; the command run again then reports the corpus complete and translates nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from transformer_nmt.data.corpus import CorpusError, check_lang
from transformer_nmt.data.language_tags import LanguageTags
from transformer_nmt.durable import atomic_write
from transformer_nmt.file_digest import content_digest
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.inference.directions import direction_of
from transformer_nmt.inference.ensemble import checkpoint_paths
from transformer_nmt.inference.translate import (
    ModelOptions,
    check_decode,
    load_model,
    plain_line,
    read_lines,
    same_file,
    translate_hypotheses,
)
from transformer_nmt.options import command_argv, option, option_of, parse_options, require_checkpoint, values_of
from transformer_nmt.provenance import collect as collect_provenance

USAGE = "python -m transformer_nmt.synthesize ckpt=PATH|[A,B,...] input=FILE output=PREFIX [key=value ...]"
PLAN = "plan.json"
# Settings of the search that change how fast it runs, not what it writes: a run started again may change them
SPEED_ONLY = ("device", "threads", "inter_threads", "max_tokens")
RESERVED = ("json", "shards")  # PREFIX.json and PREFIX.shards are the synthesis's own: no language's suffix


@dataclass
class SynthesizeOptions(ModelOptions):
    input: Optional[str] = option(None, "the source side to translate, one sentence a line (.gz too)")
    output: Optional[str] = option(None, "PREFIX: writes PREFIX.SRC, PREFIX.TGT and PREFIX.json (shards in "
                                         "PREFIX.shards/ until done)")
    src_lang: Optional[str] = option(None, "the input's language code, the suffix of PREFIX's source file "
                                           "(null: the checkpoint's data.src_lang)")
    tgt_lang: Optional[str] = option(None, "the translations' language code, the suffix of PREFIX's target file "
                                           "(null: the checkpoint's data.tgt_lang)")
    n_best: int = option_of(DecodeConfig, "n_best", help="hypotheses per input, best first (<= beam): pairs per "
                                                           "input line")
    shard_lines: int = option(1000, "input lines per shard: each is kept once translated, so a run started again "
                                    "after a kill translates only the shards not yet written")


OPTIONS = SynthesizeOptions  # what test_docs checks the docs' commands against


def model_identities(options: SynthesizeOptions) -> list[dict]:
    """Each model's path and sha256 (a checkpoint's bytes; an export's model.bin), memoized per file version."""
    if options.model_dir:
        path = Path(options.model_dir) / "model.bin"
        return [{"path": str(Path(options.model_dir)), "model.bin sha256": content_digest(path)}]
    return [{"path": str(Path(p)), "sha256": content_digest(p)} for p in checkpoint_paths(options.ckpt)]


def languages(options: SynthesizeOptions, meta: dict) -> tuple[str, str]:
    """(src_lang, tgt_lang): the options', else the checkpoint's data config's; checked as language codes (they
    become file suffixes)."""
    recorded = meta.get("data_config") if isinstance(meta.get("data_config"), dict) else {}
    chosen = []
    for name in ("src_lang", "tgt_lang"):
        lang = getattr(options, name) or recorded.get(name)
        if lang is None:
            raise SystemExit(f"{name}= is not set and the checkpoint records no data.{name}: give {name}=CODE")
        try:
            check_lang(lang, name if getattr(options, name) else f"the checkpoint's data.{name}")
        except CorpusError as error:
            raise SystemExit(str(error)) from None
        chosen.append(lang)
    for name, lang in zip(("src_lang", "tgt_lang"), chosen):
        if lang in RESERVED:
            raise SystemExit(f"{name}={lang}: PREFIX.{lang} is the synthesis's own ({', '.join(RESERVED)}): give the "
                             f"language's code")
    if chosen[0] == chosen[1]:
        raise SystemExit(f"src_lang and tgt_lang are both {chosen[0]!r}: the two files need different suffixes")
    return chosen[0], chosen[1]


def plan_digest(plan: dict) -> str:
    """The sha256 of ``plan`` (its JSON, keys sorted): what each shard records of the plan that made it."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode("utf-8")).hexdigest()


def read_shard(path: Path, first_line: int, count: int, digest: str) -> dict | None:
    """A written shard, or None where it is missing or not the shard expected (then translated again): its lines,
    and the plan that made it (``plan_sha256`` equal to ``digest``). A shard names its own plan, so that one left
    without ``plan.json`` (two launches racing on the final cleanup: one removes the directory while the other still
    writes a shard into it) is never taken into another synthesis."""
    try:
        shard = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (isinstance(shard, dict) and shard.get("first_line") == first_line and isinstance(shard.get("src"), list)
          and isinstance(shard.get("tgt"), list) and len(shard["src"]) == len(shard["tgt"])
          and shard.get("input_lines") == count and shard.get("plan_sha256") == digest)
    return shard if ok else None


def check_plan(work: Path, plan: dict) -> None:
    """Write ``plan`` into ``work`` (PREFIX.shards/), or refuse where the shards there were made by another plan.
    The plan is published exclusively (a link that fails where one exists): of two launches with different plans
    started together, one writes it and the other is refused."""
    path = work / PLAN
    if not path.exists():
        staged = work / f"{PLAN}.{uuid.uuid4().hex}"
        atomic_write(staged, lambda f: f.write(json.dumps(plan, indent=2).encode() + b"\n"))
        try:
            os.link(staged, path)  # fails if another launch published its plan meanwhile
        except FileExistsError:
            pass
        finally:
            staged.unlink()
    if path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            saved = None
        if saved != plan:
            differ = sorted(k for k in plan.keys() | (saved or {}).keys()
                            if not isinstance(saved, dict) or saved.get(k) != plan.get(k))
            raise SystemExit(f"{work} holds the shards of another synthesis (its {PLAN} differs in: "
                             f"{', '.join(differ)}): run the command that made them to finish it, or delete {work} "
                             f"to start this one")


def main(argv: list[str] | None = None) -> dict:
    options = parse_options(command_argv(argv), SynthesizeOptions, __doc__, USAGE)
    require_checkpoint(options)
    if not options.input or not options.output:
        raise SystemExit("give input=FILE (the source side) and output=PREFIX (PREFIX.SRC, PREFIX.TGT, PREFIX.json)")
    if options.shard_lines < 1:
        raise SystemExit(f"shard_lines={options.shard_lines}: must be >= 1")
    decode = values_of(DecodeConfig, options)
    try:
        check_decode(decode)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    started = time.perf_counter()
    prefix = Path(options.output)
    model, tokenizer, meta = load_model(options)
    direction = None  # a model of several pairs (data.pairs): the direction src_lang= / tgt_lang= choose
    if LanguageTags.of(meta.get("data_config")) is not None:
        direction = direction_of(options, meta)
        options.src_lang, options.tgt_lang = direction.src, direction.tgt
    src_lang, tgt_lang = languages(options, meta)
    outputs = {"src": prefix.with_name(f"{prefix.name}.{src_lang}"),
               "tgt": prefix.with_name(f"{prefix.name}.{tgt_lang}")}
    record, work = prefix.with_name(f"{prefix.name}.json"), prefix.with_name(f"{prefix.name}.shards")
    reads = [("input", options.input)] + [("ckpt", p) for p in (checkpoint_paths(options.ckpt) if options.ckpt else [])]
    for path in [*outputs.values(), record]:
        for what, read in reads:
            if same_file(path, read):
                raise SystemExit(f"output={options.output} would write {path}, the file {what}={read} names: choose "
                                 f"another prefix")
    lines = read_lines(options.input)
    plan = {"input": str(Path(options.input).resolve()),
            "input_sha256": content_digest(options.input), "input_lines": len(lines),
            "models": model_identities(options), "engine": options.engine,
            "decode": {k: v for k, v in asdict(decode).items() if k not in SPEED_ONLY},
            "src_lang": src_lang, "tgt_lang": tgt_lang, "shard_lines": options.shard_lines,
            **({"direction": direction.record()} if direction is not None else {})}
    if record.is_file():
        try:
            done = json.loads(record.read_text(encoding="utf-8"))
        except ValueError:
            done = None
        if isinstance(done, dict) and done.get("plan") == plan and all(p.is_file() for p in outputs.values()):
            print(f"{record}: this synthesis is complete ({done.get('pairs')} pairs in {outputs['src']} and "
                  f"{outputs['tgt']}); nothing to translate", file=sys.stderr)
            shutil.rmtree(work, ignore_errors=True)  # left by a run killed after it wrote the outputs
            return done
    if not work.is_dir() and any(p.exists() for p in [*outputs.values(), record]):
        existing = ", ".join(str(p) for p in [*outputs.values(), record] if p.exists())
        raise SystemExit(f"output={options.output}: {existing} exist(s) and are not this synthesis's: choose another "
                         f"prefix, or delete them")
    work.mkdir(parents=True, exist_ok=True)
    check_plan(work, plan)
    digest = plan_digest(plan)
    launch = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    starts = list(range(0, len(lines), options.shard_lines))
    shards, written_now = [], []
    for number, first in enumerate(starts):
        count = min(options.shard_lines, len(lines) - first)
        path = work / f"{number:06d}.json"
        shard = read_shard(path, first, count, digest)
        if shard is None:
            shard_started = time.perf_counter()
            part = lines[first:first + count]
            _, results = translate_hypotheses(model, tokenizer, part, decode, first_line=first, direction=direction)
            src, tgt = [], []
            for line, hyps in zip(part, results):
                for h in hyps:
                    src.append(line)
                    tgt.append(plain_line(tokenizer.decode(h.tokens)))
            shard = {"first_line": first, "input_lines": count, "plan_sha256": digest, "src": src, "tgt": tgt,
                     "launch": launch,
                     "seconds": round(time.perf_counter() - shard_started, 3)}
            text = json.dumps(shard, ensure_ascii=False).encode("utf-8")
            atomic_write(path, lambda f, text=text: f.write(text))
            written_now.append(number)
            print(f"shard {number + 1} of {len(starts)}: lines {first + 1}-{first + count} translated "
                  f"({shard['seconds']:.1f} s)", file=sys.stderr)
        shards.append(shard)
    for side, path in outputs.items():
        text = "".join(line + "\n" for shard in shards for line in shard[side]).encode("utf-8")
        atomic_write(path, lambda f, text=text: f.write(text))
    launches: dict[str, dict] = {}
    for number, shard in enumerate(shards):
        entry = launches.setdefault(shard["launch"], {"launch": shard["launch"], "shards": [], "seconds": 0.0})
        entry["shards"].append(number)
        entry["seconds"] = round(entry["seconds"] + shard["seconds"], 3)
    result = {"plan": plan, "outputs": {side: str(path) for side, path in outputs.items()},
              "pairs": sum(len(shard["src"]) for shard in shards),
              "blank_input_lines": sum(1 for line in lines if not line.strip()),
              "shards": len(shards), "launches": list(launches.values()),
              "seconds_this_launch": round(time.perf_counter() - started, 3),
              "provenance": collect_provenance({"options": {k: v for k, v in vars(options).items()}})}
    text = json.dumps(result, indent=2, ensure_ascii=False, default=str).encode("utf-8") + b"\n"
    atomic_write(record, lambda f: f.write(text))  # last: it marks the synthesis complete
    shutil.rmtree(work, ignore_errors=True)
    print(f"{result['pairs']} pairs: {outputs['src']}, {outputs['tgt']} ({record}); {len(written_now)} of "
          f"{len(shards)} shards translated by this launch", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
