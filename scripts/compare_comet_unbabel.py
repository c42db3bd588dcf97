"""One-off check: our COMET reader (metrics/comet.py) against Unbabel's unbabel-comet on the same model directory.

unbabel-comet pins numpy<2 and transformers<5, so it lives in a venv of its own; this script runs in the project's
environment, builds the tiny COMET directory of tests/tiny_comet.py (random weights, a tokenizer trained locally),
scores tests/tiny_comet.SAMPLES with ours, then runs unbabel-comet's ``load_from_checkpoint`` and ``predict`` in
the other venv on the same directory, and writes both sentence lists, their largest difference and what made them:

    python3 -m venv --system-site-packages /tmp/comet-venv && /tmp/comet-venv/bin/pip install unbabel-comet
    PYTHONPATH=src:tests python scripts/compare_comet_unbabel.py /tmp/comet-venv/bin/python \\
        docs/evaluation/comet_vs_unbabel.json

(unbabel-comet unpickles the checkpoint: only for this directory, which the script itself wrote.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from tiny_comet import SAMPLES, write_tiny_comet

from transformer_nmt.durable import atomic_write
from transformer_nmt.metrics import catalog
from transformer_nmt.provenance import PROVENANCE_KEY
from transformer_nmt.provenance import collect as collect_provenance

UNBABEL = """
import json, sys, comet, transformers, numpy
model = comet.load_from_checkpoint(sys.argv[1] + "/checkpoints/model.ckpt", local_files_only=True)
data = [{"src": s, "mt": m, "ref": r} for s, m, r in json.loads(sys.argv[2])]
out = model.predict(data, batch_size=3, gpus=0, progress_bar=False)
print(json.dumps({"scores": [float(x) for x in out.scores], "system_score": float(out.system_score),
                  "versions": {"unbabel-comet": comet.__version__, "transformers": transformers.__version__,
                               "numpy": numpy.__version__}}))
"""


def main(other_python: str, out: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for layer_norm in (True, False):
            model_dir = write_tiny_comet(Path(tmp) / f"comet_ln{int(layer_norm)}", seed=3, layer_norm=layer_norm)
            options = catalog.MetricOptions()
            options.comet.model, options.comet.device, options.comet.batch_size = str(model_dir), "cpu", 3
            metric = catalog.build("comet", options)
            sources, hypotheses, references = (list(column) for column in zip(*SAMPLES))
            ours = metric.sentence_values(hypotheses, references, sources)
            done = subprocess.run([other_python, "-c", UNBABEL, str(model_dir), json.dumps(SAMPLES)],
                                  capture_output=True, text=True, check=True)
            theirs = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append({"layer_norm": layer_norm, "ours": ours, "unbabel": theirs["scores"],
                         "max_abs_difference": max(abs(a - b) for a, b in zip(ours, theirs["scores"])),
                         "ours_system": metric.compute(hypotheses, references, sources).value,
                         "unbabel_system": theirs["system_score"], "unbabel_versions": theirs["versions"]})
    result = {"samples": SAMPLES, "rows": rows,
              PROVENANCE_KEY: collect_provenance(config={"other_python": other_python})}
    atomic_write(Path(out), lambda f: f.write((json.dumps(result, indent=2) + "\n").encode("utf-8")))
    print(json.dumps({r["layer_norm"]: r["max_abs_difference"] for r in rows}))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other_python", help="the python of a venv with unbabel-comet")
    parser.add_argument("out", help="the JSON file to write")
    arguments = parser.parse_args()
    main(arguments.other_python, arguments.out)
