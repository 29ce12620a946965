"""Roles over a corpus with confidence: the bootstrap interval against a loop, a role given only
where the interval's low end clears its threshold, the role table (one head per kind, sinks
apart, sink-and-induction heads), and `inspect`'s corpus mode and TEXT hints."""

import re

import pytest
import torch

from helpers_gpt2 import save_gpt2
from multihead.cli import main
from multihead.interpret.intervals import bootstrap_mean_interval, offset_index
from multihead.interpret.roles import (
    HeadRole,
    head_roles,
    role_table,
    sink_summary,
    sinks_that_induct,
)

TEXTS = ["The cat sat on the mat.", "A dog barked twice at the moon.", "Stocks fell sharply today."]


def test_bootstrap_interval_matches_a_loop_and_is_seeded():
    values = torch.rand(7, 2, 3)  # N=7 texts, L=2, H=3
    low, high = bootstrap_mean_interval(values, resamples=200, seed=5)
    g = torch.Generator().manual_seed(5)
    picks = torch.randint(0, 7, (200, 7), generator=g)
    means = torch.stack([values[p].double().mean(0) for p in picks])  # (R, L, H)
    want = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
    torch.testing.assert_close(low, want[0].float())
    torch.testing.assert_close(high, want[1].float())
    assert (low <= values.mean(0) + 1e-6).all() and (values.mean(0) <= high + 1e-6).all()
    same = bootstrap_mean_interval(values, resamples=200, seed=5)
    assert torch.equal(same[0], low) and torch.equal(same[1], high)
    constant = bootstrap_mean_interval(torch.full((4, 2, 3), 0.3))
    torch.testing.assert_close(constant[0], torch.full((2, 3), 0.3))


def test_offset_index():
    chosen = torch.tensor([[2.0, 1.0], [3.0, 2.0]])
    assert offset_index(chosen, (1, 2, 3)).tolist() == [[1, 0], [2, 1]]


def _metrics(value: float) -> dict:
    m = {name: torch.zeros(1, 2) for name in ("previous", "next", "self", "special")}
    m["previous"][0, 0] = m["previous"][0, 1] = value
    return m


def test_a_role_needs_the_intervals_low_end_to_clear_the_threshold():
    metrics = _metrics(0.7)  # both heads' means pass previous-token's 0.5
    low = torch.tensor([[0.55, 0.45]])
    high = torch.tensor([[0.8, 0.9]])
    roles = head_roles(metrics, intervals={"previous": (low, high)})
    (clear,) = roles[0][0]
    assert clear.role == "previous-token" and clear.ci == pytest.approx((0.55, 0.8))
    assert roles[0][1] == []  # its mean passes, its interval does not
    plain = head_roles(metrics)  # one text: the value alone decides
    assert [r.role for r in plain[0][1]] == ["previous-token"] and plain[0][1][0].ci is None


def R(layer, head, role, value, threshold=0.5, source="text"):
    return HeadRole(layer, head, role, value, threshold, f"{value}", source)


def test_role_table_one_head_per_kind_sinks_apart():
    roles = [
        [[R(0, 0, "previous-token", 0.9)], [R(0, 1, "previous-token", 0.6)]],
        [[R(1, 0, "special-token sink", 0.8, 0.6)], [R(1, 1, "special-token sink", 0.7, 0.6)]],
        [[R(2, 0, "self", 0.55)], []],
    ]
    table = role_table(roles, "text")
    assert [(r.layer, r.head) for r in table.per_kind] == [(0, 0), (2, 0)]
    assert [(r.layer, r.head) for r in table.rest] == [(0, 1)]
    assert [(r.layer, r.head) for r in table.sinks] == [(1, 0), (1, 1)] and table.passing == 5
    assert sink_summary(table.sinks) == "2 heads in layer 1 (L1: 2), 0.70-0.80 of their attention"
    sinks = [R(1, 0, "special-token sink", 0.8), R(3, 2, "special-token sink", 0.65)]
    assert sink_summary(sinks).startswith("2 heads in layers 1-3 (L1: 1, L3: 1)")
    many = [
        R(layer, h, "special-token sink", 0.7)
        for layer in range(3, 12)
        for h in range(layer % 3 + 1)
    ]
    assert sink_summary(many) == (  # past 6 layers: the three holding most
        "18 heads in 9 layers, 3-11 (most in L5: 3, L8: 3, L11: 3), 0.70-0.70 of their attention"
    )


def test_heads_that_are_sinks_on_text_and_induction_heads_on_the_probe():
    roles = [
        [
            [R(0, 0, "special-token sink", 0.8), R(0, 0, "induction", 0.5, 0.3, "probe")],
            [R(0, 1, "special-token sink", 0.8)],
            [R(0, 2, "induction", 0.5, 0.3, "probe")],
        ]
    ]
    assert sinks_that_induct(roles) == [(0, 0)]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("gpt2")
    save_gpt2(path, n_layer=2, n_head=3, n_embd=24, scale=3.0)
    return path


def test_analysis_over_texts_gives_intervals_and_one_text_none(gpt2):
    from multihead.interpret.analysis import analyze
    from multihead.interpret.subject import load_subject

    subject = load_subject(gpt2)
    many = analyze(subject, TEXTS)
    assert {"previous", "previous_best", "self", "special", "induction_best"} <= set(many.intervals)
    for name, (low, high) in many.intervals.items():
        assert low.shape == high.shape == (2, 3) and (low <= high + 1e-6).all(), name
    # text metrics: the interval holds the mean over texts
    low, high = many.intervals["special"]
    mean = many.metrics["special"]
    assert (low <= mean + 1e-5).all() and (mean <= high + 1e-5).all()
    for row in many.roles:
        for passed in row:
            for r in passed:  # every role was given on its interval's low end
                assert r.ci is not None and r.ci[0] >= r.threshold
    assert analyze(subject, TEXTS[:1]).intervals == {}


def test_inspect_over_a_corpus_prints_intervals(gpt2, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "r.json"
    assert main(["inspect", "--corpus", str(corpus), "--model", str(gpt2), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"2 layers x 3 heads, 3 texts of {corpus} (" in printed.splitlines()[0]
    assert "Roles measured on the 3 texts: " in printed
    assert "95% CI: bootstrap over the texts (probe roles: over its trials)" in printed
    if re.search(r"\nhead\s+role\s+strength\s+95% CI\s+measured", printed) is None:
        assert ": 0 of 6 heads pass a threshold" in printed  # no row, no table


def test_inspect_text_hints(gpt2, tmp_path, capsys):
    assert main(["inspect", str(gpt2), "--model", str(gpt2)]) == 2
    err = capsys.readouterr().err
    assert f"TEXT '{gpt2}' is a path on disk: did you mean --model {gpt2}?" in err
    out = tmp_path / "r.json"
    assert (
        main(["inspect", "HuggingFaceTB/SmolLM2-135M", "--model", str(gpt2), "-o", str(out)]) == 0
    )
    note = "note: TEXT 'HuggingFaceTB/SmolLM2-135M' looks like a model id: did you mean --model"
    assert note in capsys.readouterr().out
    corpus = tmp_path / "c.txt"
    corpus.write_text("One text.\n")
    assert main(["inspect", "words", "--corpus", str(corpus), "--model", str(gpt2)]) == 2
    assert "give TEXT or --corpus FILE, not both" in capsys.readouterr().err
    assert main(["inspect", "--model", str(gpt2)]) == 2
    assert "give TEXT to inspect (or --corpus FILE)" in capsys.readouterr().err


def test_the_corpus_html_report_shows_intervals_and_which_text_it_draws(gpt2, tmp_path, capsys):
    """inspect --corpus -o r.html: every role that has an interval shows it, a note names the
    text the heatmaps come from, and the terminal footer is a whole sentence."""
    import json

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "r.html"
    assert main(["inspect", "--corpus", str(corpus), "--model", str(gpt2), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "a role is given only where the interval's low end clears the role's threshold\n" in printed
    )
    page = out.read_text()
    payload = re.search(r"MultiheadReport\.render\((\{.*?\})\);</script>", page, re.S)
    assert payload is not None
    data = json.loads(payload.group(1).replace("<\\/", "</"))
    note = f"The heatmaps and line views show text 1 of 3 ({TEXTS[0]!r}); the roles"
    assert any(n.startswith(note) for n in data["notes"])
    roles = [r for layer in data["roles"] for head in layer for r in head]
    with_ci = [r for r in roles if r["ci"] is not None]
    assert with_ci  # probe roles over its trials at least
    for r in with_ci:
        assert r["text"].endswith(f"(95% CI {r['ci'][0]:.2f}-{r['ci'][1]:.2f})")
