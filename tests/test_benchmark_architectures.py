"""benchmarks/benchmark_architectures.py and benchmark_model_versions.py, their main() run in this process (each
as a command would be, with its arguments): one round gives a row per cell of the plan's rows E-H against the base,
with each cell's own parameter count; the version comparison builds both models from one seed (here this checkout
against itself: identical weights)."""

import importlib
import json
import sys
from pathlib import Path

import torch

from transformer_nmt.analysis.table3 import PLAN
from transformer_nmt.model.transformer import Transformer, TransformerConfig

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script: str, *args: str, capsys) -> str:
    """``python benchmarks/SCRIPT ARGS``' output, from its main() here (benchmarks/ on the path, as there)."""
    sys.path.insert(0, str(BENCHMARKS))
    threads = torch.get_num_threads()  # the script sets its own
    try:
        importlib.import_module(script).main(list(args))
    finally:
        sys.path.remove(str(BENCHMARKS))
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def test_one_round_of_the_architecture_step_costs(tmp_path, capsys):
    out = tmp_path / "cost.json"
    printed = run("benchmark_architectures", "--rounds", "1", "--batch", "4", "--length", "6", "--threads", "1",
                  "--cells", "swiglu", "modern", "--json", str(out), capsys=capsys)
    rows = json.loads(out.read_text())["rows"]
    assert [r["cell"] for r in rows] == ["base", "swiglu", "modern"] and rows[0]["vs_base"] == 1.0
    assert rows[1]["changes"] == {"d_ff": 344, "activation": "swiglu"}
    plan = dict((cell, overrides) for cell, _, overrides in PLAN)
    assert "model.activation=swiglu" in plan["swiglu"] and "| modern |" in printed
    with torch.device("meta"):  # the parameters reported are the composed models'
        base = dict(vocab_size=8000, d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=512)
        assert rows[0]["parameters"] == Transformer(TransformerConfig(**base)).num_parameters()


def test_a_checkout_against_itself_is_built_identically(capsys):
    src = Path(__file__).resolve().parents[1] / "src"
    printed = run("benchmark_model_versions", "--other", str(src), "--rounds", "1", "--batch", "2", "--length", "5",
                  "--decode-steps", "2", "--threads", "1", "--precision", "fp32", capsys=capsys)
    assert "identical initial weights: True" in printed
    assert "| training step, 2 x 5 tokens |" in printed and "| 2 cached greedy decoding steps, batch 2 |" in printed
