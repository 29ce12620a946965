"""The parallel benchmark's memory probe against hand-counted allocations, and a tiny run."""

from __future__ import annotations

import torch

from helpers_parallel import run_world
from multihead.bench.parallel import PeakTensorBytes, format_rows, measure_rank
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
