"""Packed products of more than KERNEL_MAX_ROWS rows (a prefill): the matrix dequantised by the
C dequantiser into one buffer owned by the call, then one float32 GEMM (`kernels.dense_mm`).
References: float64 products of the textbook dequantisation, and torch's F.linear on the
dequantised weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import multihead
from multihead.modules.quantized import PackedRows, QuantizedLinear, kernels
from multihead.modules.quantized import linear as packed_linear

ROWS = kernels.KERNEL_MAX_ROWS + 1


def packed_matrix(form: str, N: int, K: int, stored: str, seed: int = 0, **kw) -> PackedRows:
    """A random packed matrix: `stored` "float16" / "float32" (scale and zero dtype) or
    "implicit zero" (Q4_0: float16 scale, no zero)."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float32 if stored == "float32" else torch.float16
    scale = (torch.rand(N, K // 32, generator=g) * 0.1).to(dtype)
    if form == "int8":
        q8 = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
        return PackedRows("int8", (N, K), q8, scale, **kw)
    qs = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    zero = None if stored == "implicit zero" else (torch.randn(N, K // 32, generator=g) * 0.1)
    return PackedRows("int4", (N, K), qs, scale, None if zero is None else zero.to(dtype), **kw)


def textbook(p: PackedRows) -> torch.Tensor:
    """The packed matrix dequantised in float64 from its buffers (w = q s + z per group)."""
    N, K = p.shape
    assert p.scale is not None
    s = p.scale.double()[..., None]  # (N, G, 1)
    if p.form == "int8":
        return (p.qs.view(N, -1, 32).double() * s).view(N, K)
    b = p.qs.view(N, -1, 16)
    q = torch.cat((b & 15, b >> 4), -1).double()  # (N, G, 32): low nibbles first
    z = -8 * s if p.zero is None else p.zero.double()[..., None]
    return (q * s + z).view(N, K)


@pytest.fixture
def dense_calls(monkeypatch):
    """One entry (1: its one matrix) per `dense_mm` call (the path is taken, not assumed)."""
    calls: list[int] = []
    real = kernels.dense_mm

    def spy(x, int4, plan):
        calls.append(1)
        return real(x, int4, plan)

    monkeypatch.setattr(packed_linear, "dense_mm", spy)
    monkeypatch.setattr(kernels, "dense_mm", spy)
    return calls


CASES = [
    ("int4", "float16"),  # Q4_1
    ("int4", "float32"),  # Q4_K's products
    ("int4", "implicit zero"),  # Q4_0
    ("int8", "float16"),  # Q8_0
    ("int8", "float32"),
]


@pytest.mark.parametrize(("form", "stored"), CASES)
@pytest.mark.parametrize(("N", "K"), [(37, 32), (43, 608)])  # one group; 19 groups, odd N
@pytest.mark.parametrize("rows", [ROWS, 40])
def test_prefill_product_equals_dequantised_linear(form, stored, N, K, rows, dense_calls):
    if not kernels.kernels_available():
        pytest.skip("no C compiler here: the products take the torch path (tested elsewhere)")
    layer = QuantizedLinear(packed_matrix(form, N, K, stored))
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = layer(x)
        assert dense_calls == [1]
        torch.testing.assert_close(ours, F.linear(x, layer.weight), rtol=1e-6, atol=1e-6)
        expected = x.double() @ textbook(layer.packed).t()
        atol = 1e-6 * float(expected.abs().max())  # float32 sums of K terms
        torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=atol)
        # (batch, tokens, K) in, (batch, tokens, N) out: the same values, up to the GEMM's
        # rounding (MKL blocks 2 x rows rows differently from rows rows on some CPUs: AMD EPYC)
        x3 = x.view(1, rows, K).expand(2, rows, K)
        torch.testing.assert_close(layer(x3), torch.stack((ours, ours)), rtol=1e-6, atol=atol)


@pytest.mark.parametrize(("form", "stored"), [("int4", "float16"), ("int8", "float32")])
def test_matrix_above_the_tile_limit_is_dequantised_tile_by_tile(
    form, stored, dense_calls, monkeypatch
):
    """A matrix of more than _TILE_ELEMENTS values is not dequantised whole: `_tiled` takes it
    (tiles of rows), with the same values."""
    layer = QuantizedLinear(packed_matrix(form, 45, 64, stored))
    x = torch.randn(ROWS, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = layer(x)
        monkeypatch.setattr(kernels, "_TILE_ELEMENTS", 10 * 64)  # tiles of 10 rows
        tiled = layer(x)
    assert dense_calls == ([1] if kernels.kernels_available() else [])
    # equal up to float32 sums of 64 terms: a GEMM over 10 rows rounds differently from one
    # over all rows on some CPUs (MKL on AMD EPYC: ~1e-5 of values ~1)
    atol = 1e-6 * float(whole.abs().max()) * 8
    torch.testing.assert_close(tiled, whole, rtol=1e-6, atol=atol)
    torch.testing.assert_close(tiled, F.linear(x, layer.weight), rtol=1e-6, atol=atol)


def test_without_kernels_the_prefill_takes_the_torch_path(monkeypatch, dense_calls):
    layer = QuantizedLinear(packed_matrix("int4", 37, 96, "float16"))
    x = torch.randn(ROWS, 96, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = x.double() @ textbook(layer.packed).t()
        monkeypatch.setattr(kernels, "_library", lambda extra=(): None)
        kernels._PLANS.clear()  # (plans made with the library)
        ours = layer(x)
    assert dense_calls == []
    atol = 1e-6 * float(expected.abs().max())
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=atol)


def test_bfloat16_model_computes_in_float32_and_casts_back(dense_calls):
    """A model loaded in bfloat16: the activations widen to float32, the product is the
    float32 one (the dequantised float32 weight) rounded to bfloat16 once."""
    if not kernels.kernels_available():
        pytest.skip("no C compiler here")
    p = packed_matrix("int4", 41, 96, "float16", dtype=torch.bfloat16)
    w32 = packed_matrix("int4", 41, 96, "float16").rows(0, 41)  # same seed: same buffers
    layer = QuantizedLinear(p)
    x = torch.randn(ROWS, 96, generator=torch.Generator().manual_seed(4)).bfloat16()
    with torch.no_grad():
        ours = layer(x)
    assert ours.dtype == torch.bfloat16 and dense_calls == [1]
    torch.testing.assert_close(ours, (x.float() @ w32.t()).bfloat16(), rtol=0, atol=0)


def test_blocks_form_prefill_equals_dequantised_linear():
    """The file's own blocks ("blocks": a dequantiser given by the loader) at prefill rows."""
    g = torch.Generator().manual_seed(6)
    w = torch.randn(39, 64, generator=g).half()
    raw = w.view(torch.uint8)  # (39, 128): "blocks" of float16 bytes

    def dequantize(rows: torch.Tensor) -> torch.Tensor:
        return rows.contiguous().view(torch.float16).float()

    layer = QuantizedLinear(PackedRows("blocks", (39, 64), raw.clone(), dequantize=dequantize))
    x = torch.randn(ROWS, 64, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, w.float()), rtol=1e-6, atol=1e-6)


def test_swiglu_at_prefill_rows_equals_the_module_by_module_product(dense_calls):
    """SwiGLU's packed gate, up and down at prefill rows: each through `dense_mm` (gate and up
    are not fused above one row: measured no faster), the block's product equal to the one
    with a hook on `up` (module by module) and to float64."""
    if not kernels.kernels_available():
        pytest.skip("no C compiler here")
    K = 96
    mlp = multihead.modules.feedforward.SwiGLU(K, 64)
    mlp.gate = QuantizedLinear(packed_matrix("int4", 64, K, "float16", seed=10))
    mlp.up = QuantizedLinear(packed_matrix("int4", 64, K, "implicit zero", seed=11))
    mlp.down = QuantizedLinear(packed_matrix("int8", K, 64, "float32", seed=12))
    x = torch.randn(2, ROWS, K, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        fused = mlp(x)
        assert dense_calls == [1, 1, 1]
        handle = mlp.up.register_forward_hook(lambda m, i, o: None)
        try:
            hooked = mlp(x)
        finally:
            handle.remove()
    assert torch.equal(fused, hooked)
    w = {n: textbook(getattr(mlp, n).packed) for n in ("gate", "up", "down")}
    x64 = x.double()
    expected = (F.silu(x64 @ w["gate"].t()) * (x64 @ w["up"].t())) @ w["down"].t()
    atol = 1e-6 * float(expected.abs().max())  # float32 sums
    torch.testing.assert_close(fused.double(), expected, rtol=1e-4, atol=atol)


def test_bench_prefill_only_table(monkeypatch, tmp_path):
    """`multihead bench decode --gguf --prefill-only`: children asked for no decoding (repeats
    0), engines alternating per round, and the table's ratios are per round to fp32 (median
    and range), not a ratio of medians."""
    from multihead.bench import quantized as bench

    times = {"quantized": [1.0, 2.2, 0.9], "fp32": [1.0, 2.0, 1.0]}
    seen: list[tuple[str, int]] = []

    def child(engine, path, threads, prompt, new, prefill, python, repack=False, repeats=3):
        seen.append((engine, repeats))
        t = times[engine][sum(e == engine for e, _ in seen) - 1]
        return dict(decode_tps=0.0, prefill_s=t, tokens=[], isa="avx512")

    monkeypatch.setattr(bench, "_child", child)
    out = bench.decode(tmp_path / "m.gguf", rounds=3, prefill=64, prefill_only=True, compiled=True)
    assert [e for e, _ in seen] == ["quantized", "fp32", "fp32", "quantized", "quantized", "fp32"]
    assert {r for _, r in seen} == {0}
    row = next(line.split() for line in out.splitlines() if line.startswith("quantized"))
    # per-round ratios 1.0, 1.1, 0.9: median 1.0 (the medians' ratio would be 1.0 / 1.0 too,
    # but the range shows the spread), and the median prefill time 1.0 s
    assert row == ["quantized", "1000", "1.000x", "0.900", "-", "1.100"]
    assert "prefill of 64 tokens" in out and "compiled" not in out
