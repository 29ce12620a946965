"""A causal LM's HTML report in headless Chromium: the upper triangle (keys a causal head cannot
see) is grey in the heatmap and the thumbnails, next-token mass reads "n/a", and the toggles keep
both; plus the report data and the CLI/library lists of model types."""

import shutil

import pytest

from helpers_gpt2 import EOT, save_gpt2

pytest.importorskip("transformers")

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
GREY = [222, 222, 222]


@pytest.fixture(scope="module")
def subject(tmp_path_factory):
    from multihead.interpret.subject import load_subject

    path = tmp_path_factory.mktemp("gpt2")
    save_gpt2(path, n_layer=2, n_head=3, n_embd=24, scale=3.0)
    return load_subject(path)


@pytest.fixture(scope="module")
def analysis(subject):
    from multihead.interpret.analysis import analyze

    return analyze(subject, [TEXT])


def test_report_data_marks_the_causal_pattern(analysis):
    from multihead.interpret.report_html import report_data

    data = report_data(analysis, title="gpt2")
    T = len(data["tokens"])
    assert data["causal"] is True and data["kind"] == "causal LM"
    assert data["special"] == [True] + [False] * (T - 1)
    assert len(data["word_starts"]) == T and data["word_starts"][0]
    assert "next" in data["metric_names"] and "next" not in data["metrics"]
    assert data["undefined"] == {"next": "a causal head never attends to a later token"}
    assert data["role_metric"]["previous-token"] == "previous_best"


def test_the_cli_and_the_library_agree_on_model_types():
    from multihead.cli.model_dir import CAUSAL_LM_TYPES, ENCODER_TYPES
    from multihead.interpret.subject import ENCODER_TYPES as SUBJECT_ENCODER_TYPES
    from multihead.models import CAUSAL_LM_FAMILIES, ENCODER_FAMILIES

    assert set(ENCODER_TYPES) == set(SUBJECT_ENCODER_TYPES) == set(ENCODER_FAMILIES)
    assert set(CAUSAL_LM_TYPES) == set(CAUSAL_LM_FAMILIES)


def test_pooled_png_thumbnails_grey_only_blocks_wholly_above_the_diagonal():
    import numpy as np

    from multihead.interpret.report_png import _hide_future

    T = 64
    a = np.tril(np.ones((T, T), dtype=np.float32))
    a /= a.sum(-1, keepdims=True)
    pooled = _hide_future(a, True, pool=8)  # blocks of 8 x 8 tokens
    assert pooled.shape == (8, 8)
    expected = np.triu(np.ones((8, 8), dtype=bool), 1)  # a block on the diagonal has weights
    np.testing.assert_array_equal(np.ma.getmaskarray(pooled), expected)
    assert not np.ma.isMaskedArray(_hide_future(a, False, pool=8))


def pixel(page, selector: str, x: float, y: float) -> list[int]:
    """The RGB at (x, y), as fractions of the canvas's size, of the first canvas matching."""
    return page.evaluate(
        """([sel, fx, fy]) => {
          const c = document.querySelector(sel);
          const d = c.getContext("2d").getImageData(
            Math.floor(fx * c.width), Math.floor(fy * c.height), 1, 1).data;
          return [d[0], d[1], d[2]];
        }""",
        [selector, x, y],
    )


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_causal_report_in_headless_chromium(subject, analysis, tmp_path):
    from playwright.sync_api import sync_playwright

    from multihead.interpret.analysis import analyze
    from multihead.interpret.report_html import HTMLReport

    path = tmp_path / "causal.html"
    HTMLReport(analysis, title="gpt2", open_head=(1, 2)).save(path)
    long = tmp_path / "long.html"  # 64 tokens: thumbnails max-pool blocks of tokens
    HTMLReport(analyze(subject, [TEXT * 3], max_tokens=64, probe=False), title="long").save(long)
    tokens = analysis.texts[0].tokens
    T = len(tokens)
    near = 0.5 / T  # the centre of the first cell, as a fraction of the canvas
    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "request",
            lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None,
        )
        page.goto(path.as_uri())
        page.wait_for_selector(".mh-report[data-ready='1']", timeout=30_000)
        assert page.locator(".mh-cell").count() == 6
        assert page.locator("h3").inner_text().startswith("Layer 1, head 2")
        heat = "canvas[id$='-heat']"
        # above the diagonal: grey; the first column (BOS) of the last query: a weight's colour
        assert pixel(page, heat, 1 - near, near) == GREY
        assert pixel(page, heat, near, 1 - near) != GREY
        assert pixel(page, heat, near, near) != GREY  # query 0 on itself: weight 1
        thumb = ".mh-cell[data-layer='0'][data-head='1'] canvas"
        assert pixel(page, thumb, 0.99, 0.01) == GREY and pixel(page, thumb, 0.01, 0.99) != GREY
        assert "a causal head cannot attend to them" in page.locator(".mh-legend").inner_text()
        assert page.locator("[id$='-xlab'] span").all_inner_texts()[0] == EOT
        # hovering a cell above the diagonal says why it is empty
        box = page.locator(heat).bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * (1 - near), box["y"] + box["height"] * near)
        assert "not attended (causal)" in page.locator(".mh-tip").inner_text()
        # the metrics table: next-token mass is n/a for every head, with the reason
        names = page.locator("table th").all_inner_texts()
        column = [n.split()[0] for n in names].index("next")
        cells = page.locator(f"table tbody td:nth-child({column + 1})")
        assert cells.all_inner_texts() == ["n/a"] * 6
        assert "never attends to a later token" in (cells.first.get_attribute("title") or "")
        # hiding the special token (BOS) and merging byte-level pieces keep the causal shape
        page.locator("input[id$='-special']").check()
        assert EOT not in page.locator("[id$='-xlab']").inner_text()
        assert pixel(page, heat, 0.99, 0.01) == GREY
        page.locator("input[id$='-merge']").check()
        merged = page.locator("[id$='-xlab'] span").all_inner_texts()
        assert len(merged) < T - 1 and "quick" in [m.strip() for m in merged]
        assert pixel(page, heat, 0.99, 0.01) == GREY and pixel(page, heat, 0.01, 0.99) != GREY

        page.goto(long.as_uri())
        page.wait_for_selector(".mh-report[data-ready='1']", timeout=30_000)
        size = page.evaluate("document.querySelector('.mh-cell canvas').width")
        assert size == 48  # pooled: 64 tokens in 48 pixels
        for layer, head in ((0, 0), (1, 2)):
            thumb = f".mh-cell[data-layer='{layer}'][data-head='{head}'] canvas"
            assert pixel(page, thumb, 0.99, 0.01) == GREY
            assert pixel(page, thumb, 0.01, 0.99) != GREY
            assert pixel(page, thumb, 0.5, 0.5) != GREY  # a block on the diagonal
        browser.close()
    assert errors == []
    assert requests == []


def test_png_metric_panels_show_n_a_for_undefined_metrics(analysis, tmp_path, monkeypatch):
    from matplotlib.axes import Axes
    from matplotlib.image import imread

    from multihead.interpret import report_png

    written = []
    real = Axes.text
    monkeypatch.setattr(
        Axes, "text", lambda self, x, y, s, **kw: written.append(s) or real(self, x, y, s, **kw)
    )
    path = tmp_path / "metrics.png"
    report_png.metrics_png(analysis, path, metrics=("previous", "next", "special"))
    assert "n/a" in written and any(
        "never attends to a later token" in " ".join(w.split()) for w in written
    )
    assert imread(path).std() > 0.05
