"""The small-call rows of `multihead bench attention` read the median of per-round ratios (each
from two samples run next to each other), not the ratio of two medians taken apart."""

from multihead.bench import attention_small


def test_small_call_rows_report_the_median_of_per_round_ratios(monkeypatch):
    seen = []

    def fake_rounds(fns, *, repeats, min_time):
        seen.append((sorted(fns), repeats, min_time))
        # per round: 2.0, 1.5, 10.0 -> median 2.00x; the medians' ratio would read 3.00x
        return {"mh": [2e-6, 3e-6, 10e-6], "floor": [1e-6, 2e-6, 1e-6]}

    monkeypatch.setattr(attention_small, "measure_rounds", fake_rounds)
    text = attention_small.report(repeats=3)
    rows = [line for line in text.splitlines() if line.startswith(("eval", "decode"))]
    assert len(rows) == 2
    for row in rows:
        assert row.split()[-3:] == ["3", "1", "2.00x"]  # mh us, floor us (medians), ratio
    assert "median of 3 per-round ratios" in text
    assert seen == [(["floor", "mh"], 3, attention_small.SAMPLE_TIME)] * 2


def test_a_full_run_takes_many_short_rounds_and_quick_few(monkeypatch):
    from multihead.bench import attention

    asked = []
    monkeypatch.setattr(attention, "run_suite", lambda *a, **k: [])
    monkeypatch.setattr(attention, "report", lambda *a, **k: "table")
    monkeypatch.setattr(attention, "matmul_gflops", lambda *a, **k: 1.0)
    monkeypatch.setattr(attention_small, "report", lambda repeats: asked.append(repeats) or "")
    attention.main(quick=False, repeats=None)
    attention.main(quick=True, repeats=None)
    assert asked == [attention_small.ROUNDS, 3]
    assert attention_small.ROUNDS >= 101 and attention_small.SAMPLE_TIME <= 0.02
