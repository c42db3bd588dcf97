"""The notebooks execute from top to bottom (so they cannot rot)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(name, env_setup=""):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    if env_setup:
        notebook.cells.insert(0, nbformat.v4.new_code_cell(env_setup))
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
                   ).execute()
    return notebook


def stdout_of(notebook):
    return "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for out in cell.outputs if out.get("name") == "stdout")


def test_attention_walkthrough_executes_and_shows_the_shape_table():
    text = stdout_of(execute("attention_walkthrough.ipynb"))
    assert "Q, K, V after split    (2, 8, 4, 64)" in text
    assert "scores / weights       (2, 8, 4, 4)" in text
    assert "permutation equivariance: True" in text
    assert "a query that sees no key -> zeros, no NaN: True" in text


def test_attention_maps_notebook_plots_every_head(tmp_path):
    from tiny_checkpoint import tiny_tokenizer, write_checkpoint

    write_checkpoint(tmp_path / "tiny.ckpt", tiny_tokenizer())
    notebook = execute("attention_maps.ipynb",
                       env_setup=f"import os; os.environ['NMT_CKPT'] = {str(tmp_path / 'tiny.ckpt')!r}")
    text = stdout_of(notebook)
    assert "encoder attention: 1 layers x (2," in text and "cross attention: 1 layers x (2," in text
    images = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
              if "image/png" in out.get("data", {})]
    assert len(images) == 3  # one figure per kind, each holding layers x heads maps
