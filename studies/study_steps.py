"""What the multi-step studies share: each step a command of this package, run once (skipped when its output exists,
so a study killed or stopped goes on where it was), and a run's final weights scored as evaluate scores them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from transformer_nmt.checkpoint import checkpoint_tokenizer, read_checkpoint
from transformer_nmt.data.corpus import CorpusError, CorpusSpec, split_inputs
from transformer_nmt.inference.evaluate import main as evaluate
from transformer_nmt.inference.translate import read_lines

SCORES = ("bleu", "bleu_lowercase", "bleu_multi30k", "chrf", "length_ratio", "sentences")


def run_step(name: str, done: Path, command: list[str]) -> float:
    """``python -m COMMAND...`` unless ``done`` exists; the seconds it took (0 when skipped). A failing step stops
    the study with its exit status, naming it."""
    if done.exists():
        print(f"[{name}] done already ({done})", flush=True)
        return 0.0
    print(f"[{name}] python -m {' '.join(command)}", flush=True)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", *command])
    if result.returncode != 0:
        raise SystemExit(f"[{name}] failed (exit status {result.returncode}): python -m {' '.join(command)}")
    if not done.exists():
        raise SystemExit(f"[{name}] ended without writing {done}")
    return round(time.perf_counter() - started, 1)


def model_argument(ckpts: list[Path]) -> str:
    """The ``ckpt=`` value of evaluate, translate and synthesize for these checkpoints: the one path, or
    ``[A,B,...]``, their ensemble."""
    return str(ckpts[0]) if len(ckpts) == 1 else f"[{','.join(str(c) for c in ckpts)}]"


def model_files(value: str) -> list[Path]:
    """The checkpoint files a ``ckpt=`` value names (``model_argument``'s inverse)."""
    return [Path(p) for p in value.strip("[]").split(",")] if value.startswith("[") else [Path(value)]


def save_vocabulary(ckpt: Path, path: Path) -> None:
    """The SentencePiece model ``ckpt`` embeds, written to ``path`` unless it exists (``data.tokenizer_path=`` for
    a model that must share its vocabulary)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint_tokenizer(read_checkpoint(ckpt, mmap=True), str(ckpt)).save(path)


def evaluate_once(ckpt: Path | str, out: Path, name: str, options: list[str]) -> dict:
    """evaluate's record of ``ckpt`` as OUT/NAME.json, decoded only when that file does not already hold an evaluation
    of the same checkpoint (or ensemble, ``[A,B,...]``) with the same ``options`` (evaluate's other key=value options:
    split= or src=/ref=, beam=, the languages), written after every checkpoint file and every input file named: a
    study run again with more seeds scores only what is new, and one whose checkpoint, test set or beam changed
    scores again."""
    record = out / f"{name}.json"
    if record.exists() and reusable(record, [f"ckpt={ckpt}", *options]):
        print(f"[evaluate {name}] done already ({record})", flush=True)
        return json.loads(record.read_text(encoding="utf-8"))
    return evaluate([f"ckpt={ckpt}", f"out={out}", f"name={name}", *options])


def reusable(record: Path, options: list[str]) -> bool:
    """Whether ``record`` (an evaluate record) was made with every key=value of ``options``, as its provenance
    recorded them, and after every file they name (the checkpoint, a source or reference file)."""
    try:
        made = json.loads(record.read_text(encoding="utf-8"))["provenance"]["config"]["options"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    written = record.stat().st_mtime
    for option in options:
        key, value = option.split("=", 1)
        recorded = made.get(key, object())
        if isinstance(recorded, list):  # an ensemble: evaluate records its checkpoints as a list
            recorded = model_argument(recorded)
        if (str(recorded).lower() if isinstance(recorded, bool) else str(recorded)) != value:
            return False
        files = model_files(value) if key == "ckpt" else [Path(value)] if key in ("src", "ref") else []
        if any(not f.exists() or f.stat().st_mtime >= written for f in files):
            return False
    return True


def score(ckpt: Path, splits: list[str], beam: int, out: Path, extra: list[str] = ()) -> dict:
    """evaluate's scores of ``ckpt`` on each split of its own data (beam ``beam``)."""
    scores = {}
    for split in splits:
        result = evaluate([f"ckpt={ckpt}", f"split={split}", f"beam={beam}", f"out={out}", *extra])
        scores[split] = {key: result.get(key) for key in SCORES}
    return scores


def parallel_files(prefix: str | Path, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """PREFIX.SRC and PREFIX.TGT (``.gz`` too), found as ``data.train=PREFIX`` finds them (corpus.split_inputs)."""
    spec = CorpusSpec(format="text", langs=(src_lang, tgt_lang), locations={"train": str(prefix)})
    try:
        src, tgt = split_inputs(spec, "train")
    except CorpusError as error:
        raise SystemExit(str(error)) from None
    return Path(src), Path(tgt)


def parallel_lines(prefix: str | Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """The lines of PREFIX.SRC and PREFIX.TGT, split as translate and synthesize split them (on "\\n" only)."""
    src, tgt = (read_lines(path) for path in parallel_files(prefix, src_lang, tgt_lang))
    if len(src) != len(tgt):
        raise SystemExit(f"{prefix}: {len(src)} {src_lang} lines, {len(tgt)} {tgt_lang} lines")
    return src, tgt


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 2) if values else None
