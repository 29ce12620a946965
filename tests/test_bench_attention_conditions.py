"""`multihead bench attention --mask KIND --conditions ...`: each condition's threads and
competing process, every row's target, the caller's threads given back, and the refusals."""

import contextlib

import pytest
import torch

from multihead.bench import attention_conditions, attention_structure, contend
from multihead.cli import main


def test_parse_takes_thread_counts_default_and_contend():
    assert attention_conditions.parse("1,default,contend", 2) == ("1", "default", "contend")
    assert attention_conditions.parse("2", 2) == ("2",)
    for bad in ("3", "0", "idle", "1,,default", "-1"):
        with pytest.raises(ValueError, match="--conditions takes"):
            attention_conditions.parse(bad, 2)


@pytest.fixture
def fake_measures(monkeypatch):
    """Every measurement replaced: records (what, threads, competing process running)."""
    events = []
    busy = []

    @contextlib.contextmanager
    def fake_busy(seconds=contend.MAX_SECONDS):
        busy.append(True)
        yield None
        busy.pop()

    def fake_rows(kinds, quick, repeats, contended):
        events.append(("structure", torch.get_num_threads(), bool(busy), contended))
        ratio = "2.50x"  # over the idle 2x, within the contended 3x
        target = attention_structure.FUNCTION_TARGET_CONTENDED if contended else 2.0
        return [["window", "f", *"abc", ratio, "3", *"defghijk", f"{target:.2f}x",
                 attention_structure.holds(ratio, target)]]  # fmt: skip

    def fake_dense(shapes, repeats):
        events.append(("dense", torch.get_num_threads(), bool(busy)))
        return [attention_conditions._row("dense", "1 ms", "1 ms", 1.2, 1.1)]

    def fake_small(rounds):
        events.append(("small", torch.get_num_threads(), bool(busy)))
        return [attention_conditions._row("eval", "1 us", "1 us", 1.0, 1.15)]

    monkeypatch.setattr(contend, "busy_process", fake_busy)
    monkeypatch.setattr(attention_structure, "rows", fake_rows)
    monkeypatch.setattr(attention_conditions, "dense_rows", fake_dense)
    monkeypatch.setattr(attention_conditions, "small_rows", fake_small)
    return events


def test_each_condition_runs_its_threads_and_competing_process(fake_measures):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = []
        missed = attention_conditions.run(("window",), ("1", "default", "contend"), emit=out.append)
        assert torch.get_num_threads() == 2  # the caller's count again
    finally:
        torch.set_num_threads(before)
    assert fake_measures == [
        ("structure", 1, False, False), ("dense", 1, False), ("small", 1, False),
        ("structure", 2, False, False), ("dense", 2, False), ("small", 2, False),
        ("structure", 2, True, True), ("dense", 2, True), ("small", 2, True),
    ]  # fmt: skip
    # per condition: the dense row (1.2x of 1.1x) misses; the structured row only when idle
    assert missed == 2 + 2 + 1
    text = "\n".join(out)
    assert "== condition: 1 thread, no competing process; load average" in text
    assert "== condition: default threads (2), no competing process" in text
    assert "== condition: default threads (2) beside a busy process" in text
    assert text.count("target") >= 6 and "1.20x   1.10x     NO" in text
    assert out[-1].startswith("summary: 1 thread, no competing process: 2 row(s) over target")


def test_the_cli_runs_the_conditions_with_its_threads(fake_measures, capsys):
    before = torch.get_num_threads()
    try:
        assert main(["bench", "attention", "--mask", "window", "--conditions", "default",
                     "--threads", "1", "--quick"]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert fake_measures[0] == ("structure", 1, False, False)  # default = --threads
    assert "summary:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--conditions", "default"], "--conditions measures the structured table"),
        (["--mask", "window", "--conditions", "default", "--contend"], "use 'contend' in it"),
        (["--mask", "window", "--conditions", "1,lots"], "--conditions takes"),
        (["--mask", "window", "--conditions", "1", "--dtype", "bf16"], "--mask measures"),
    ],
)
def test_the_cli_refuses_conditions_it_cannot_run(argv, message, capsys):
    assert main(["bench", "attention", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("multihead: error: ") and message in err and err.count("\n") == 1
