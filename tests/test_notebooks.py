"""The notebooks are committed executed: a fresh run reproduces their text outputs exactly (so they
cannot rot, nor show stale results), from the cells that scripts/make_notebooks.py holds."""

import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import make_notebooks  # noqa: E402

REGENERATE = "run python scripts/make_notebooks.py and commit the notebooks"


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpt")
    make_notebooks.write_tiny_checkpoint(directory)
    return directory


def images(notebook):
    return [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
            if "image/png" in out.get("data", {})]


@pytest.mark.parametrize("name", list(make_notebooks.NOTEBOOK_CELLS))
def test_committed_notebook_is_executed_and_its_outputs_are_current(name, checkpoint_dir):
    path = make_notebooks.NOTEBOOKS / name
    committed = nbformat.read(path, as_version=4)
    expected = make_notebooks.build(make_notebooks.NOTEBOOK_CELLS[name])
    assert [c.source for c in committed.cells] == [c.source for c in expected.cells], (
        f"{name}: cells changed; {REGENERATE}")
    assert path.stat().st_size < 500_000, f"{name} is {path.stat().st_size} bytes: lower the figures' size or dpi"

    fresh = make_notebooks.execute(expected, checkpoint_dir)
    texts = [make_notebooks.text_outputs(notebook, checkpoint_dir) for notebook in (committed, fresh)]
    assert texts[0] == texts[1], f"{name}: committed outputs are stale; {REGENERATE}"
    assert len(images(committed)) == len(images(fresh)) > 0


def test_walkthrough_shows_the_shape_table_the_invariants_and_the_d_k_plot():
    notebook = nbformat.read(make_notebooks.NOTEBOOKS / "attention_walkthrough.ipynb", as_version=4)
    text = "".join(t for cell in make_notebooks.text_outputs(notebook, Path("/nowhere")) for t in cell)
    assert "Q, K, V after split    (2, 8, 4, 64)" in text
    assert "scores / weights       (2, 8, 4, 4)" in text
    assert "permutation equivariance: True" in text
    assert "a query that sees no key -> zeros, no NaN: True" in text
    assert len(images(notebook)) == 2  # the causal mask, the d_k plot


def test_maps_notebook_plots_every_head_of_the_tiny_checkpoint():
    notebook = nbformat.read(make_notebooks.NOTEBOOKS / "attention_maps.ipynb", as_version=4)
    text = "".join(t for cell in make_notebooks.text_outputs(notebook, Path("/nowhere")) for t in cell)
    assert "checkpoint: $TMP/tiny_random.ckpt" in text
    assert "encoder attention: 1 layers x (2," in text and "cross attention: 1 layers x (2," in text
    assert len(images(notebook)) == 3  # one figure per kind, each holding layers x heads maps
