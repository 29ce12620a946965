"""The import graph of src/multihead runs one way: no circle of files, no arrow from a lower layer
to a higher one, no circle between the parts of a layer (tools/import_layers.py holds the layers
and the rules; imports inside functions and under TYPE_CHECKING count)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import import_layers  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def test_src_has_no_circle_and_no_upward_arrow():
    found = import_layers.problems(ROOT / "src")
    assert not found, "the import graph broke its rules:\n" + "\n".join(found)


def test_development_md_shows_the_current_layers():
    """docs/development.md's picture is the one the script draws from today's code."""
    text = (ROOT / "docs" / "development.md").read_text()
    picture = import_layers.picture()
    assert picture in text, (
        "docs/development.md's layer picture is stale: paste the output of "
        "`python tools/import_layers.py --picture`"
    )


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for name, code in files.items():
        path = src / "multihead" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code))
    return src


LAYERS = [
    ("low", ("functional",), ""),
    ("mid", ("modules", "models"), ""),
    ("top", ("multihead",), ""),
]


def test_rules_find_every_kind_of_offence(tmp_path):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "functional/__init__.py": "",
            # an upward import hidden in a function
            "functional/a.py": "def f():\n    from ..modules import b\n",
            "modules/__init__.py": "from .b import X\n",  # a package re-exporting: no circle
            # a circle closed by a TYPE_CHECKING import
            "modules/b.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from .c import Y
                X = 1
            """,
            "modules/c.py": "from multihead.modules.b import X\nY = 2\n",
            # sideways both ways: a circle of parts, though no circle of files
            "models/__init__.py": "",
            "models/d.py": "import multihead.modules.e\n",
            "modules/e.py": "from ..models import f\n",
            "models/f.py": "",
            "extra.py": "",  # a part with no layer
        },
    )
    found = import_layers.problems(src, LAYERS)
    assert "multihead.extra has no layer: add it to LAYERS in tools/import_layers.py" in found
    circle = [p for p in found if p.startswith("circle of files")]
    assert len(circle) == 1
    assert "multihead.modules.b -> multihead.modules.c" in circle[0]
    assert "multihead.modules.c -> multihead.modules.b" in circle[0]
    upward = [p for p in found if p.startswith("upward arrow")]
    assert len(upward) == 1 and "multihead.functional.a -> multihead.modules.b" in upward[0]
    assert "src/multihead/functional/a.py:2" in upward[0]
    parts = [p for p in found if p.startswith("circle of parts")]
    assert len(parts) == 1
    assert "multihead.models.d -> multihead.modules.e" in parts[0]
    assert "multihead.modules.e -> multihead.models.f" in parts[0]
    assert len(found) == 4


@pytest.mark.parametrize(
    ("line", "target"),
    [
        ("from . import b", "multihead.modules.b"),  # a module of the package
        ("from .b import X", "multihead.modules.b"),
        ("from .. import modules", "multihead.modules"),
        ("from ..modules import X", "multihead.modules"),  # a name the __init__ defines
        ("import multihead.modules.b as bee", "multihead.modules.b"),
        ("from multihead.modules.b import X", "multihead.modules.b"),
    ],
)
def test_imports_resolve(tmp_path, line, target):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "modules/__init__.py": "X = 1\n",
            "modules/a.py": f"def f():\n    {line}\n",
            "modules/b.py": "X = 1\n",
        },
    )
    found = [(a.source, a.target) for a in import_layers.arrows(src)]
    assert found == [("multihead.modules.a", target)]
