"""The parallel benchmark's memory probe against hand-counted allocations, and a tiny run."""

from __future__ import annotations

import pytest
import torch

from multihead.bench.parallel import PeakTensorBytes, run


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


@pytest.mark.slow
def test_bench_runs_and_prints_a_table():
    table = run(world_sizes=(1, 2), seq_lens=(16, 24), heads=2, head_dim=4, block_size=8,
                repeats=1)  # fmt: skip
    lines = table.splitlines()
    assert "gloo on cpu" in lines[1]
    rows = [line.split() for line in lines[4:]]
    assert [(r[0], r[1]) for r in rows] == [("16", "1"), ("16", "2"), ("24", "1"), ("24", "2")]
    for r in rows:
        assert float(r[3]) >= 0 and float(r[4]) >= 0  # MiB: ring per rank, attention()
        assert float(r[5]) > 0 and float(r[6]) > 0 and float(r[7]) > 0  # ms and their ratio
