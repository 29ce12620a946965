"""`multihead bench attention --mask`: wiring, refusals, and the ideal's pair counts."""

import pytest

from multihead.bench import attention_structure
from multihead.cli import main


@pytest.mark.parametrize("kind", attention_structure.MASKS)
@pytest.mark.parametrize("T", [512, 1024])
def test_allowed_pairs_count_the_dense_mask(kind, T):
    assert attention_structure.allowed_pairs(kind, T) == int(
        attention_structure.dense_mask(kind, T).sum()
    )


def test_mask_routes_to_the_structure_suite(monkeypatch, capsys):
    seen = []

    def fake_main(kinds, quick, repeats, contended):
        seen.append((kinds, quick, repeats, contended))
        return "table"

    monkeypatch.setattr(attention_structure, "main", fake_main)
    assert main(["bench", "attention", "--mask", "window", "--repeats", "2"]) == 0
    assert main(["bench", "attention", "--mask", "all", "--quick"]) == 0
    assert seen == [(("window",), False, 2, False), (attention_structure.MASKS, True, 3, False)]
    assert "table" in capsys.readouterr().out


def test_mask_refuses_other_devices_and_dtypes(capsys):
    assert main(["bench", "attention", "--mask", "window", "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("multihead: error: --mask measures --device cpu --dtype fp32")
    assert err.count("\n") == 1


def test_rows_read_the_median_of_per_round_ratios(monkeypatch):
    """The ideal comes from each round's own samples; the ratio is their median, not the ratio
    of medians taken apart (which a load change between rounds would move)."""
    rounds = {
        # module: ideal = projections + share x (causal - projections), per round
        "causal": [1.0, 2.0, 1.0],
        "projections": [0.5, 1.0, 0.5],
        "structured": [0.5, 1.0, 2.0],
        "dense mask": [3.0, 3.0, 3.0],
    }
    monkeypatch.setattr(attention_structure, "measure_rounds", lambda fns, **k: rounds)
    T = 1024
    share = attention_structure.allowed_pairs("window", T) / (T * (T + 1) / 2)
    ideals = [
        p + share * (c - p) for p, c in zip(rounds["projections"], rounds["causal"], strict=True)
    ]
    row = attention_structure.module_row("window", T, repeats=3)
    want = sorted(s / i for s, i in zip(rounds["structured"], ideals, strict=True))[1]
    assert row[5] == f"{want:.2f}x"
    assert row[3] == f"{sorted(ideals)[1] * 1e3:.0f}"
    # the ratio of medians would read otherwise here
    assert f"{1.0 / sorted(ideals)[1]:.2f}x" != row[5]


def test_contend_measures_beside_a_busy_process_the_bench_stops(monkeypatch, capsys):
    import contextlib

    from multihead.bench import contend

    events = []

    @contextlib.contextmanager
    def fake_busy(seconds=contend.MAX_SECONDS):
        events.append("start")
        yield None
        events.append("stop")

    def fake_main(kinds, quick, repeats, contended):
        events.append(("measure", contended))
        return "table"

    monkeypatch.setattr(contend, "busy_process", fake_busy)
    monkeypatch.setattr(attention_structure, "main", fake_main)
    assert main(["bench", "attention", "--mask", "window", "--contend"]) == 0
    # measured while it ran, against the contended target
    assert events == ["start", ("measure", True), "stop"]
    out = capsys.readouterr().out
    assert out.startswith("condition: beside a busy process (") and "table" in out


def test_the_competing_process_runs_and_is_stopped():
    from multihead.bench import contend

    with contend.busy_process(seconds=60) as proc:
        assert proc.poll() is None  # running its products (it said so before the body began)
    assert proc.poll() is not None  # stopped when the bench is done, not at its deadline


def test_rows_carry_the_target_of_their_condition(monkeypatch):
    monkeypatch.setattr(
        attention_structure, "function_row", lambda kind, T, repeats: [kind, "f", *"abc", "2.50x"]
    )
    monkeypatch.setattr(
        attention_structure, "module_row", lambda kind, T, repeats: [kind, "m", *"abc", "1.20x"]
    )
    idle = attention_structure.rows(("window",), quick=True)
    busy = attention_structure.rows(("window",), quick=True, contended=True)
    assert [r[-2:] for r in idle] == [["2.00x", "NO"], ["1.20x", "yes"]]
    assert [r[-2:] for r in busy] == [["3.00x", "yes"], ["1.20x", "yes"]]


def test_the_mask_mod_case_is_the_window_as_a_mask_function():
    import torch

    from multihead import attention

    T = 1024
    args = attention_structure.structure_args("mask_mod", T)
    assert set(args) == {"mask_mod", "block_size"}
    q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
    want = attention(q, k, v, causal=True, window=attention_structure.WINDOW)
    torch.testing.assert_close(attention(q, k, v, causal=True, **args), want)
    # the rows time it held as a plan, built outside the rounds (its build time a cell)
    plan_args, build_ms = attention_structure.held("mask_mod", T, args)
    assert set(plan_args) == {"mask_mod"} and float(build_ms) >= 0
    assert plan_args["mask_mod"].window == attention_structure.WINDOW - 1
    torch.testing.assert_close(attention(q, k, v, causal=True, **plan_args), want)
    assert attention_structure.held("window", T, {"window": 3}) == ({"window": 3}, "")


def test_the_documents_mod_case_is_the_documents_as_a_mask_function():
    import torch

    from multihead import attention

    T = 1024
    args = attention_structure.structure_args("documents_mod", T)
    q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
    want = attention(q, k, v, causal=True, **attention_structure.structure_args("documents", T))
    torch.testing.assert_close(attention(q, k, v, causal=True, **args), want)
    plan_args, build_ms = attention_structure.held("documents_mod", T, args)
    assert float(build_ms) >= 0
    plan = plan_args["mask_mod"]
    assert plan.window is None  # not a window: exactly causal documents, their ids recovered
    assert torch.equal(plan.documents, torch.arange(8).repeat_interleave(T // 8)[None])
    torch.testing.assert_close(attention(q, k, v, causal=True, **plan_args), want)
    assert attention_structure.allowed_pairs("documents_mod", T) == int(
        attention_structure.dense_mask("documents_mod", T).sum()
    )


def test_the_general_mod_case_is_the_general_plan():
    import torch

    from multihead import attention

    T = 1024
    args = attention_structure.structure_args("general_mod", T)
    q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
    ids = attention_structure.structure_args("documents", T)["documents"]
    window = attention_structure.GENERAL_WINDOW
    want = attention(q, k, v, causal=True, documents=ids, window=window)
    torch.testing.assert_close(attention(q, k, v, causal=True, **args), want)
    plan_args, _ = attention_structure.held("general_mod", T, args)
    plan = plan_args["mask_mod"]
    assert plan.window is None and plan.documents is None  # neither fast path: the general plan
    torch.testing.assert_close(attention(q, k, v, causal=True, **plan_args), want)
    assert attention_structure.allowed_pairs("general_mod", T) == int(
        attention_structure.dense_mask("general_mod", T).sum()
    )


def test_mask_takes_several_kinds_in_order(monkeypatch, capsys):
    from multihead.cli import bench_attention

    assert bench_attention.MASKS == attention_structure.MASKS
    seen = []
    monkeypatch.setattr(attention_structure, "main", lambda kinds, **kw: seen.append(kinds) or "")
    assert main(["bench", "attention", "--mask", "prefix,documents", "--quick"]) == 0
    assert seen == [("prefix", "documents")]
    for wrong in ("prefix,nope", "window,window", ""):
        assert main(["bench", "attention", "--mask", wrong]) == 2
        err = capsys.readouterr().err
        assert err.startswith("multihead: error:") and "--mask" in err
        assert err.count("\n") == 1


def test_flex_column_stays_compiled_row_after_row(recwarn):
    """Each row compiles flex_attention anew; past dynamo's recompile limit a row would time
    flex's unfused eager fallback (it warns that it runs without torch.compile). With the
    limit at 1, a second row of another shape and mask still runs compiled code."""
    import torch

    # (dynamo's own scoped patch: monkeypatch's undo deletes the config entry)
    with torch._dynamo.config.patch(recompile_limit=1):
        for kind, T in (("window", 256), ("documents", 512)):
            q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
            flex = attention_structure._flex(kind, q, k, v)
            assert not isinstance(flex, str), flex
            run, build_seconds = flex
            run()
            assert build_seconds >= 0
    assert not [w for w in recwarn if "without torch.compile" in str(w.message)]


def test_rows_report_how_many_fast_path_calls_ran_inline(monkeypatch):
    """The "inline" cell counts the structured contender's fast-path calls that the per-call
    thread choice ran inline, of all it made (forward and backward, each time it ran)."""
    import torch

    from multihead.functional.backends import tile_threads

    def once(fns, **kwargs):  # every contender run once, as one round
        times = {}
        for name, fn in fns.items():
            fn()
            times[name] = [1.0]
        return times

    monkeypatch.setattr(attention_structure, "measure_rounds", once)
    monkeypatch.setattr(attention_structure, "_flex", lambda *a: "n/a (skipped)")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(tile_threads, "_runnable", lambda: 1)  # free cores
        row = attention_structure.module_row("window", 1024, repeats=1)
        assert row[attention_structure.HEADERS.index("inline")] == "2/2"  # small: inline
        monkeypatch.setattr(tile_threads, "_runnable", lambda: 10**6)  # taken
        row = attention_structure.module_row("window", 1024, repeats=1)
        assert row[attention_structure.HEADERS.index("inline")] == "0/2"
    finally:
        torch.set_num_threads(before)
    assert attention_structure.inline_cell([]) == ""  # the general plan: no fast path
    assert attention_structure.inline_cell([1, 2, 2]) == "1/3"


def test_module_rows_say_what_the_module_adds_around_projections_and_function(monkeypatch):
    """The "around ms" cell: per round, structured - projections - attention() alone, then
    the median (a load change between rounds moves all three of a round together)."""
    rounds = {
        "causal": [1.0, 2.0, 1.0],
        "projections": [0.5, 1.0, 0.5],
        "structured": [0.7, 1.6, 0.9],
        "dense mask": [3.0, 3.0, 3.0],
        "attention": [0.1, 0.2, 0.3],
    }
    monkeypatch.setattr(attention_structure, "measure_rounds", lambda fns, **k: rounds)
    row = attention_structure.module_row("window", 1024, repeats=3)
    assert row[attention_structure.HEADERS.index("around ms")] == "100"  # 100, 400, 100 ms
    del rounds["attention"]  # (not measured: no cell)
    assert attention_structure.around_cell(rounds) == ""
    assert len(row) == len(attention_structure.HEADERS) - 2  # (target and holds follow)
