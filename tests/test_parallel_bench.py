"""The parallel benchmark's memory probes against hand-counted sizes, and tiny runs of the ring and
tensor-parallel parts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers_parallel import run_world
from multihead.bench.parallel import PeakTensorBytes, format_rows, measure_rank
from multihead.bench.tensor_parallel import format_tp_rows, measure_tp_rank
from multihead.cli import main
from multihead.parallel import sequence_positions


def test_peak_tensor_bytes_by_hand():
    given = torch.ones(250_000)  # 1 MB that existed before: never counted, nor its views
    with PeakTensorBytes() as probe:
        a = torch.empty(1000, 1000)  # 4 MB
        b = torch.empty(500, 1000)  # 2 MB
        view = given[:10] + 0  # 40 bytes (the slice itself is a view of `given`)
        del a
        c = torch.empty(2000, 1000)  # 8 MB: live 10 MB
        d = c * 2  # 8 MB: live 18 MB, the peak
        del d
    assert probe.peak == 18_000_040
    assert probe.live == 10_000_040  # b, view, c
    del b, view, c
    assert probe.live == 0


CONFIG = dict(backend="gloo", seq_lens=[64, 96], batch=1, heads=4, kv_heads=2, head_dim=32,
              causal=True, layout="zigzag", backward=True, block_size=8, dtype="float32",
              repeats=1, threads=1)  # fmt: skip


def check_measure(rank: int, world: int, out_dir: str) -> None:
    rows = measure_rank(rank, world, torch.device("cpu"), CONFIG)
    assert [(r["T"], r["P"]) for r in rows] == [(64, world), (96, world)]
    for r in rows:
        assert r["ring_s"] > 0
        # At least this rank's q, k, v (fp32) and their gradients.
        n = max(len(sequence_positions(r["T"], world, p, layout="zigzag")) for p in range(world))
        assert r["ring_bytes"] >= 2 * 4 * n * 32 * (4 + 2 + 2)  # q, k, v and their grads
        assert ("attention_s" in r) == (world == 1)
    if rank == 0:
        torch.save(rows, f"{out_dir}/rows{world}.pt")


def test_bench_measures_every_world_and_prints_a_table(tmp_path):
    run_world(check_measure, 1, str(tmp_path))
    run_world(check_measure, 2, str(tmp_path))
    rows = torch.load(tmp_path / "rows1.pt") + torch.load(tmp_path / "rows2.pt")
    lines = format_rows(rows, CONFIG).splitlines()
    assert "forward + backward" in lines[0] and "gloo on cpu" in lines[1]
    table = [line.split() for line in lines[4:]]
    assert [(r[0], r[1]) for r in table] == [("64", "1"), ("64", "2"), ("96", "1"), ("96", "2")]
    for r in table:  # T, P, T/P, ring MiB, attention() MiB, ring ms, attention() ms, ratio
        assert float(r[3]) > 0 and float(r[4]) > 0 and float(r[7]) > 0


TP_CONFIG = dict(backend="gloo", batch=2, seq_len=12, repeats=1, threads=1,
                 model=dict(vocab_size=29, dim=16, num_layers=2, num_heads=4, num_kv_heads=2,
                            ffn_dim=24, position="rope", mlp="swiglu", norm="rmsnorm",
                            bias=False, max_positions=16))  # fmt: skip


def check_measure_tp(rank: int, world: int, out_dir: str) -> None:
    rows = measure_tp_rank(rank, world, torch.device("cpu"), TP_CONFIG)
    if rank == 0:
        torch.save(rows, f"{out_dir}/tp{world}.pt")


def test_tensor_parallel_bench_memory_and_table(tmp_path):
    run_world(check_measure_tp, 1, str(tmp_path))
    run_world(check_measure_tp, 2, str(tmp_path))
    one, two = torch.load(tmp_path / "tp1.pt")[0], torch.load(tmp_path / "tp2.pt")[0]
    # By hand (fp32, bias-free): per layer in_proj (4 + 2 + 2) * 4 x 16 and out_proj 16 x 16;
    # SwiGLU 3 x 24 x 16; two layers. At tp = 2: half of each (kv heads 2: one per rank).
    attention, mlp = 2 * (8 * 4 * 16 + 16 * 16) * 4, 2 * 3 * 24 * 16 * 4
    assert one["unsharded bytes"]["attention weights"] == attention
    assert (one["attention weights"], one["MLP weights"]) == (attention, mlp)
    assert (two["attention weights"], two["MLP weights"]) == (attention // 2, mlp // 2)
    # Embeddings (29 x 16, tied head) and 5 norms of 16: replicated.
    assert one["other"] == two["other"] == (29 * 16 + 5 * 16) * 4
    assert one["tp_s"] > 0 and one["unsharded_s"] > 0 and two["tp_s"] > 0
    lines = format_tp_rows([one, two], TP_CONFIG).splitlines()
    assert "dim=16 layers=2 H=4 Hkv=2" in lines[0] and "gloo on cpu" in lines[1]
    table = [line.split() for line in lines[4:]]
    assert [r[0] for r in table] == ["unsharded", "tp=1", "tp=2"]
    assert [r[6] for r in table] == ["-", "1/1.00", "1/2.00"]  # attention + MLP per rank


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--kv-heads", "3"], "--kv-heads 3 must divide --heads 8"),
        (["--seq-lens", "6"], "needs at least 8 positions"),
        (["--layout", "contiguous", "--seq-lens", "3"], "needs at least 4 positions"),
        (["--what", "tensor", "--world-sizes", "3"], "num_heads (8) must be a multiple"),
        (["--what", "tensor", "--dim", "100"], "times an even head width"),
        (["--what", "tensor", "--heads", "4", "--kv-heads", "3"], "must divide --heads 4"),
        (
            ["--what", "tensor", "--heads", "12", "--kv-heads", "3", "--dim", "96"],
            "--world-sizes 2: num_kv_heads (3) must be a multiple",
        ),
        (["--world-sizes", "0"], "argument --world-sizes"),
        (["--what", "all"], "argument --what"),
    ],
)
def test_cli_bench_parallel_refuses_bad_options_before_any_work(
    capsys, monkeypatch, argv, fragment
):
    import multihead.bench.parallel as ring_bench
    import multihead.bench.tensor_parallel as tp_bench

    def never(**kwargs):
        raise AssertionError("a benchmark started")

    monkeypatch.setattr(ring_bench, "run", never)
    monkeypatch.setattr(tp_bench, "run_tensor_parallel", never)
    assert main(["bench", "parallel", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("multihead: error: "), captured.err
    assert fragment in lines[0] and captured.out == ""


def test_cli_bench_parallel_passes_its_options(capsys, monkeypatch):
    import multihead.bench.parallel as ring_bench
    import multihead.bench.tensor_parallel as tp_bench

    seen = {}
    monkeypatch.setattr(ring_bench, "run", lambda **kw: seen.setdefault("ring", kw) and "RING")
    monkeypatch.setattr(
        tp_bench, "run_tensor_parallel", lambda **kw: seen.setdefault("tp", kw) and "TP"
    )
    argv = ["bench", "parallel", "--world-sizes", "2", "1", "--seq-lens", "64", "--backward",
            "--heads", "4", "--kv-heads", "2", "--dim", "32", "--threads", "2"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out == "RING\n\nTP\n"
    assert seen["ring"]["world_sizes"] == (1, 2) and seen["ring"]["seq_lens"] == (64,)
    assert seen["ring"]["backward"] and seen["ring"]["kv_heads"] == 2
    assert seen["tp"]["dim"] == 32 and seen["tp"]["heads"] == 4 and seen["tp"]["threads"] == 2
    seen.clear()
    assert main(["bench", "parallel", "--what", "tensor", "--quick"]) == 0
    assert "ring" not in seen and seen["tp"]["dim"] == 64 and seen["tp"]["repeats"] == 2


def test_cli_bench_parallel_help_imports_no_torch():
    code = (
        "import sys, contextlib, io\n"
        "from multihead.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['bench', 'parallel', '-h'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
