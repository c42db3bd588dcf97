"""studies/decoding_samples.py on a run of small random models: every mode's command is recorded as a user types
it, its output has the shape translate's docstring gives, and the prefix and ensemble samples are what translate
itself writes for those options."""

import importlib.util
import json
from pathlib import Path

import pytest
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.inference.translate import main as translate_main

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "decoding_samples.py"


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("decoding_samples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tmp = tmp_path_factory.mktemp("samples")
    run = tmp / "run"
    tokenizer = tiny_tokenizer()
    for step in (10, 20, 30, 40):
        write_checkpoint(run / "checkpoints" / "recent" / f"step{step}.ckpt", tokenizer, seed=step, step=step,
                         run="one")
    write_checkpoint(run / "averaged.ckpt", tokenizer, seed=99, step=40, run="one")
    out = tmp / "docs" / "samples.json"
    module.main([f"run={run}", "ensemble=2", f"out={out}"])
    return module, run, json.loads(out.read_text(encoding="utf-8")), tmp


def test_every_mode_is_recorded_with_its_command_and_output_shape(samples):
    module, _, data, _ = samples
    assert list(data["samples"]) == list(module.MODES)
    out = {mode: sample["output"] for mode, sample in data["samples"].items()}
    n = len(module.INPUT)
    for mode in ("plain", "ensemble", "sampling_top_p", "sampling_top_k", "prefix"):
        assert len(out[mode]) == n and all("\t" not in line for line in out[mode]), mode
    assert [line.split("\t")[0] for line in out["n_best"]] == ["1", "1", "1", "2", "2", "2"]
    for line in out["score_reference"]:
        total, per_token, count = line.split("\t")
        assert float(total) < 0 and abs(float(total) / int(count) - float(per_token)) < 1e-4
    assert data["samples"]["ensemble"]["command"] == ("python -m transformer_nmt.translate "
        "ckpt=[RUN/checkpoints/recent/step30.ckpt,RUN/checkpoints/recent/step40.ckpt] input=in.en")
    assert data["samples"]["n_best"]["command"].endswith("ckpt=RUN/averaged.ckpt input=in.en n_best=3")
    assert data["provenance"]["config"]["options"]["ensemble"] == 2


def test_prefix_and_ensemble_samples_are_translate_s_own_output(samples):
    module, run, data, tmp = samples
    (tmp / "in.en").write_text("".join(line + "\n" for line in module.INPUT), encoding="utf-8")
    (tmp / "prefix.de").write_text("".join(line + "\n" for line in module.PREFIX), encoding="utf-8")
    recent = run / "checkpoints" / "recent"
    for mode, args in {"prefix": [f"ckpt={run / 'averaged.ckpt'}", f"prefix={tmp / 'prefix.de'}"],
                       "ensemble": [f"ckpt=[{recent / 'step30.ckpt'},{recent / 'step40.ckpt'}]"]}.items():
        translate_main([*args, f"input={tmp / 'in.en'}", f"output={tmp / mode}"])
        assert data["samples"][mode]["output"] == (tmp / mode).read_text(encoding="utf-8").splitlines(), mode
    assert data["samples"]["prefix"]["output"][0].startswith(module.PREFIX[0])
