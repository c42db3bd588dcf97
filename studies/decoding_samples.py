"""The samples of docs/evaluation.md's decoding modes from a trained run: each mode's translate command run on the
same input lines, its output kept as translate wrote it.

    python studies/decoding_samples.py run=outputs/multi30k_cpu_en_de/RUN out=docs/evaluation/decoding_samples.json

MODES holds each sample's options; in them RUN stands for the run directory, ``in.en``, ``ref.de`` and
``prefix.de`` for files this script writes from INPUT, REFERENCE and PREFIX, and ENSEMBLE for the run's newest
``ensemble`` checkpoints of checkpoints/recent/. The model is RUN/averaged.ckpt (the recipe writes it). Writes
``out`` (JSON: each mode's command, as a user types it, and its output lines; the inputs; provenance) and prints
it; scripts/docs_tables.py writes the samples into docs/evaluation.md from that file.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from transformer_nmt.inference.average import last_checkpoints
from transformer_nmt.inference.translate import main as translate
from transformer_nmt.options import parse_options
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

OPTIONS = {"run": None, "ensemble": 3, "out": "decoding_samples.json"}
USAGE = "python studies/decoding_samples.py run=RUN [ensemble=3] [out=FILE.json]"

INPUT = ["A man in a blue shirt is riding a bike.", "Two dogs play in the snow."]
REFERENCE = ["Ein Mann in einem blauen Hemd fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
PREFIX = ["Ein Junge", ""]  # the first line forced to start otherwise, the second decoded as without a prefix
MODEL = "ckpt=RUN/averaged.ckpt"
MODES = {  # name: translate's options after ckpt= (MODEL unless the mode names its own)
    "plain": [MODEL, "input=in.en"],
    "ensemble": ["ckpt=ENSEMBLE", "input=in.en"],
    "n_best": [MODEL, "input=in.en", "n_best=3"],
    "sampling_top_p": [MODEL, "input=in.en", "sampling=true", "top_p=0.9", "seed=1"],
    "sampling_top_k": [MODEL, "input=in.en", "sampling=true", "temperature=0.7", "top_k=10", "seed=2"],
    "score_reference": [MODEL, "input=in.en", "score_reference=ref.de"],
    "prefix": [MODEL, "input=in.en", "prefix=prefix.de"],
}


def option_value(word: str, run: Path, tmp: Path, files: dict) -> str:
    """A shown option as it runs: RUN/ the run directory, a file of ``files`` the one written into ``tmp``."""
    key, value = word.split("=", 1)
    if value in files:
        return f"{key}={tmp / value}"
    return f"{key}={value.replace('RUN/', f'{run}/')}"


def main(argv: list[str]) -> dict:
    options = parse_options(argv, OPTIONS, __doc__, USAGE)
    if not options["run"]:
        raise SystemExit("give run=RUN: a run directory with averaged.ckpt and checkpoints/recent/")
    run = Path(options["run"])
    if not (run / "averaged.ckpt").is_file():
        raise SystemExit(f"run={run}: no averaged.ckpt (python -m transformer_nmt.reproduce train=false "
                         f"run_dir={run} writes it)")
    provenance = collect_provenance({"options": options}, argv=[sys.argv[0], *argv])
    recent = last_checkpoints(run / "checkpoints" / "recent", options["ensemble"])
    ensemble = "[" + ",".join(f"RUN/{p.relative_to(run)}" for p in recent) + "]"
    samples = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"in.en": INPUT, "ref.de": REFERENCE, "prefix.de": PREFIX}
        for name, lines in files.items():
            (Path(tmp) / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        for mode, words in MODES.items():
            shown = [w.replace("ENSEMBLE", ensemble) for w in words]
            actual = [option_value(w, run, Path(tmp), files) for w in shown]
            output = Path(tmp) / f"{mode}.out"
            translate([*actual, f"output={output}"])
            samples[mode] = {"command": "python -m transformer_nmt.translate " + " ".join(shown),
                             "output": output.read_text(encoding="utf-8").splitlines()}
    result = {"input": INPUT, "reference": REFERENCE, "prefix": PREFIX, "samples": samples,
              "checkpoints": {"model": "RUN/averaged.ckpt", "ensemble": ensemble}, PROVENANCE_KEY: provenance}
    Path(options["out"]).parent.mkdir(parents=True, exist_ok=True)
    Path(options["out"]).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(samples, indent=2, ensure_ascii=False))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
