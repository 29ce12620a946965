"""q, k and v projected as whole blocks of one buffer (modules/blocked_projection.py), which a
module's structured self-attention uses on CPU where the tiled backend runs: equal to the one
fused F.linear and its gradients, taken only where it serves, and the module's results equal
to the dense-mask path's (fp64) with the tiled backend writing the blocks' gradients in place."""

import pytest
import torch
import torch.nn.functional as F

from multihead import MultiHeadAttention
from multihead.functional import masks
from multihead.functional.backends import tile_packed, tiled
from multihead.modules import attention_project as attention_module
from multihead.modules.blocked_projection import blocked_projection, blocked_projection_serves

from conftest import assert_close


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("widths", [(24, 24, 24), (32, 8, 8)])
@pytest.mark.parametrize("wants", ["all", "x only", "weights only"])
def test_blocks_equal_the_fused_linear_and_its_gradients(bias, widths, wants):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=gen)
    W = torch.randn(sum(widths), 16, dtype=torch.float64, generator=gen)
    b = torch.randn(sum(widths), dtype=torch.float64, generator=gen) if bias else None
    leaves = [t for t in (x, W, b) if t is not None]
    x.requires_grad_(wants != "weights only")
    for t in leaves[1:]:
        t.requires_grad_(wants != "x only")
    inputs = [t for t in leaves if t.requires_grad]
    got = blocked_projection(x, W, b, widths)
    want = F.linear(x, W, b).split(widths, dim=-1)
    gs = [torch.randn(p.shape, dtype=torch.float64, generator=gen) for p in want]
    for a, c in zip(got, want, strict=True):
        assert_close(a, c, torch.float64)
    # each block is a whole (B, T, w) run of one buffer
    assert all(p._base is got[0]._base and p.is_contiguous() for p in got)
    grad_got = torch.autograd.grad(got, inputs, gs)
    grad_want = torch.autograd.grad(want, inputs, gs)
    for a, c in zip(grad_got, grad_want, strict=True):
        assert_close(a, c, torch.float64)


def test_it_serves_structured_cpu_calls_long_enough_for_the_tiled_backend():
    layer = torch.nn.Linear(16, 48)
    long, short = torch.randn(1, 1024, 16), torch.randn(1, 1023, 16)
    assert blocked_projection_serves(layer, long)
    assert not blocked_projection_serves(layer, short)  # below the tiled backend's size
    assert not blocked_projection_serves(layer, long.bfloat16())
    assert not blocked_projection_serves(layer.double(), long)  # (dtypes differ)
    layer.register_forward_hook(lambda *a: None)  # a hook on the layer: its own __call__ runs
    assert not blocked_projection_serves(layer, long)


@pytest.fixture
def spies(monkeypatch):
    """Records the blocks of each blocked projection (3: q, k, v; 1: the output projection)
    and whether the tiled backend found q, k, v as views covering one buffer (so it wrote
    their gradients in place)."""
    seen = {"blocked": [], "covers": []}
    blocked = attention_module.blocked_projection
    views = tile_packed.packed_views

    def count(*args):
        seen["blocked"].append(len(args[3]))
        return blocked(*args)

    def record(q, k, v):
        found = views(q, k, v)
        seen["covers"].append(found is not None and found.covers)
        return found

    monkeypatch.setattr(attention_module, "blocked_projection", count)
    monkeypatch.setattr(tiled, "packed_views", record)
    return seen


def _documents(B, T):
    ids = torch.zeros(B, T, dtype=torch.long)
    ids[:, 300:] = 1
    ids[1, 700:] = 2
    return ids


def _dense(kind, B, T):
    causal = masks.causal(T)
    if kind == "window":
        return masks.sliding_window(T, T, 100)
    if kind == "prefix":
        mask = causal.clone()
        mask[..., :250, :250] = True
        return mask
    ids = _documents(B, T)
    return (ids[:, :, None] == ids[:, None, :])[:, None] & causal


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("kind", ["window", "documents", "prefix"])
def test_module_structure_through_blocks_equals_the_dense_mask(spies, kind, kv_heads):
    torch.manual_seed(0)
    B, T = 2, 1024
    m = MultiHeadAttention(32, 4, num_kv_heads=kv_heads, causal=True).double()
    x = torch.randn(B, T, 32, dtype=torch.float64, requires_grad=True)
    args = {"window": {"window": 100}, "prefix": {"prefix": 250}}.get(
        kind, {"documents": _documents(B, T)}
    )
    out = m(x, **args)
    assert spies["blocked"] == [3, 1] and spies["covers"] == [True]  # q, k, v; the output
    ref = m(x, mask=_dense(kind, B, T), causal=False)  # (the masks hold causality)
    assert spies["blocked"] == [3, 1]  # (a dense mask keeps the one matmul, F.linear out)
    assert_close(out, ref, torch.float64)
    g = torch.randn_like(out)
    params = [x, *m.parameters()]
    for a, c in zip(
        torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g), strict=True
    ):
        assert_close(a, c, torch.float64)


def test_a_module_beside_a_busy_process_projects_in_units_on_the_workers(monkeypatch):
    """The module's own weights are Parameters: beside a busy process its blocked q, k, v
    projection and its output projection run as units of rows on the workers (forward and
    backward), and the module's result and every gradient equal the dense-mask path's
    (fp64)."""
    from multihead.functional.backends import tile_threads
    from multihead.modules import blocked_units

    ran = []
    real_run = blocked_units.run
    monkeypatch.setattr(blocked_units, "run", lambda u, n: ran.append(n) or real_run(u, n))
    monkeypatch.setattr(tile_threads, "_runnable", lambda: 10**6)  # every core busy
    monkeypatch.setattr(tile_threads, "_cores", lambda: 2)
    torch.manual_seed(0)
    B, T = 2, 1024
    m = MultiHeadAttention(32, 4, num_kv_heads=2, causal=True).double()
    x = torch.randn(B, T, 32, dtype=torch.float64, requires_grad=True)
    ids = _documents(B, T)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = m(x, documents=ids)
        assert ran == [2, 2]  # the forward's products (q, k, v; out), units on two workers
        g = torch.randn_like(out)
        params = [x, *m.parameters()]
        got = torch.autograd.grad(out, params, g)
        assert ran == [2, 2, 2, 2]  # and the gradients'
    finally:
        torch.set_num_threads(before)
    ref = m(x, mask=_dense("documents", B, T), causal=False)
    assert_close(out, ref, torch.float64)
    for a, c in zip(got, torch.autograd.grad(ref, params, g), strict=True):
        assert_close(a, c, torch.float64)


def test_calls_it_does_not_serve_keep_the_fused_matmul(spies):
    m = MultiHeadAttention(32, 4, causal=True)
    x = torch.randn(1, 1024, 32)
    m(x)  # no structure
    m(x[:, :512], window=64)  # too short for the tiled backend
    with torch.no_grad():
        m(x, window=64)  # (no gradient: blocks serve the forward alone too)
    assert spies["blocked"] == [3, 1]


@pytest.mark.parametrize("args", [{"window": 64}, {"prefix": 10}])
def test_an_empty_batch_gives_an_empty_result(args):
    m = MultiHeadAttention(16, 2, causal=True)
    x = torch.randn(0, 1024, 16, requires_grad=True)
    out = m(x, **args)
    assert out.shape == (0, 1024, 16)
    out.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("layer", ["in_proj", "out_proj"])
def test_a_parametrized_projection_runs_through_its_own_forward(layer):
    # (torch.nn.utils.parametrize moves the weight out of _parameters: the plain-layer test
    # once raised KeyError on it; a structured call's output projection goes through blocks
    # only where the layer is plain, like its q, k, v projection)
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    torch.manual_seed(0)
    m = MultiHeadAttention(16, 2, causal=True).double()
    plain = MultiHeadAttention(16, 2, causal=True).double()
    plain.load_state_dict(m.state_dict())
    with torch.no_grad():
        getattr(plain, layer).weight.mul_(2)
    parametrize.register_parametrization(getattr(m, layer), "weight", Doubled())
    x = torch.randn(1, 1030, 16, dtype=torch.float64)
    for args in ({}, {"window": 64}):
        assert_close(m(x, **args), plain(x, **args), torch.float64)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("widths", [(8, 8, 8), (16, 8, 8)], ids=["equal", "grouped"])
@pytest.mark.parametrize(
    "threads, running, path",
    [(1, 1, "batched"), (2, 10**6, "units"), (2, 1, "blocks"), (3, 1, "batched")],
    ids=["1-thread", "2-threads-busy", "2-threads-free", "3-threads-3-blocks"],
)
def test_each_way_of_running_the_products_equals_the_fused_linear(
    bias, widths, threads, running, path, monkeypatch
):
    """The products run as one batched product each (forward, weight gradient: one parallel
    region instead of one per block) where the blocks are equal and the threads share them
    evenly or there is one thread; one product per block where the cores are free and they
    cannot (3 blocks on 2 threads) or the widths differ; units of rows on the tiled backend's
    workers beside a busy process (`blocked_units`). Every way equals F.linear and its
    gradients (fp64), on a weight that is not contiguous too."""
    from multihead.functional.backends import tile_threads
    from multihead.modules import blocked_projection as bp
    from multihead.modules import blocked_units

    calls = []
    for name in ("bmm", "baddbmm"):
        real = getattr(torch, name)
        monkeypatch.setattr(
            torch, name, lambda *a, _real=real, _n=name, **k: calls.append(_n) or _real(*a, **k)
        )
    real_run = blocked_units.run
    monkeypatch.setattr(
        blocked_units, "run", lambda units, n: calls.append(f"units:{n}") or real_run(units, n)
    )
    monkeypatch.setattr(tile_threads, "_runnable", lambda: running)
    monkeypatch.setattr(tile_threads, "_cores", lambda: 2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    W = torch.randn(16, sum(widths), dtype=torch.float64, generator=gen).t().requires_grad_()
    b = torch.randn(sum(widths), dtype=torch.float64, generator=gen, requires_grad=True)
    b = b if bias else None
    inputs = [t for t in (x, W, b) if t is not None]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = blocked_projection(x, W, b, widths)
        want = F.linear(x, W, b).split(widths, dim=-1)
        gs = [torch.randn(p.shape, dtype=torch.float64, generator=gen) for p in want]
        for a, c in zip(got, want, strict=True):
            assert_close(a, c, torch.float64)
        grads = torch.autograd.grad(got, inputs, gs)
        for a, c in zip(grads, torch.autograd.grad(want, inputs, gs), strict=True):
            assert_close(a, c, torch.float64)
    finally:
        torch.set_num_threads(before)
    if path == "units":  # forward, then the gradients, on the workers
        assert calls == ["units:2", "units:2"]
    elif path == "batched" and widths == (8, 8, 8):  # forward, then the weight gradient
        assert calls == ["baddbmm" if bias else "bmm", "bmm"]
    else:  # a product per block
        assert calls == []
    assert bp._equal((8, 8, 8)) and not bp._equal((32, 8, 8)) and not bp._equal((8,))


def test_units_of_rows_cover_every_row_once():
    from multihead.modules.blocked_units import parts

    for count, wanted in [(7, 4), (3, 8), (1024, 6), (1, 1)]:
        runs = parts(count, wanted)
        assert [i for r in runs for i in range(count)[r]] == list(range(count))
        assert len(runs) == min(wanted, count) and all(r.stop > r.start for r in runs)


def test_a_busy_call_under_a_dispatch_mode_keeps_the_products_in_this_thread(monkeypatch):
    """Under a dispatch mode (FlopCounterMode) the products must run where the mode sees them
    (`tile_threads.workers`): beside a busy process too, no units, and the counter reads
    what it reads on free cores."""
    from torch.utils.flop_counter import FlopCounterMode

    from multihead.functional.backends import tile_threads
    from multihead.modules import blocked_units

    monkeypatch.setattr(blocked_units, "run", lambda *a: pytest.fail("ran on the workers"))
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    W = torch.randn(24, 16, dtype=torch.float64, requires_grad=True)

    def counted(running: int):
        monkeypatch.setattr(tile_threads, "_runnable", lambda: running)
        with FlopCounterMode(display=False) as counter:
            out = sum(p.sum() for p in blocked_projection(x, W, None, (8, 8, 8)))
            grads = torch.autograd.grad(out, (x, W))
        return counter.get_total_flops(), grads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        busy, grads = counted(10**6)
        free, _ = counted(1)
    finally:
        torch.set_num_threads(before)
    # the forward and the weight gradient's products at least (2 N C W each), as on free cores
    assert busy == free >= 4 * 10 * 16 * 24
    want = torch.autograd.grad(F.linear(x, W).sum(), (x, W))
    for a, c in zip(grads, want, strict=True):
        assert_close(a, c, torch.float64)
