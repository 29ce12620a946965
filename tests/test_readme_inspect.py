"""The induction-head example of the Inspect page (docs/inspect.md, moved there from the README)
runs as written."""

import contextlib
import io
import re
from pathlib import Path

import torch

PAGE = Path(__file__).resolve().parents[1] / "docs" / "inspect.md"


def test_induction_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    (example,) = [b for b in blocks if b.startswith("# Induction heads on a CausalLM")]
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, str(PAGE), "exec"), namespace)
    assert namespace["result"].heads.shape == (2, 4)
    assert namespace["dla"].heads.shape == (2, 4, 4, 20)
    assert torch.isfinite(namespace["mean_ablated"]).all()
    assert "recovered" in printed.getvalue() and "block 1" in printed.getvalue()
