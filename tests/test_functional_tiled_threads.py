"""The tiled backend's fast paths on worker threads (`functional/backends/tile_threads.py`):
the same numbers as the calling thread's own run, the fp64 reference, and no thread count of
the caller's changed."""

import threading
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from multihead import attention
from multihead.functional.backends import tile_threads
from multihead.functional.backends import tiled as tiled_backend

from reference import reference_attention

T, D = 300, 8
_real_runnable = tile_threads._runnable


@pytest.fixture(autouse=True)
def busy_machine(monkeypatch):
    """The machine's cores read as taken (`tile_threads.per_call`'s probe), so these small
    calls run on the workers as large ones do on any machine; tests of the probe set it."""
    monkeypatch.setattr(tile_threads, "_runnable", lambda: 10**6)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _args(kind: str, B: int) -> dict:
    if kind == "window":
        return {"window": 40}
    if kind == "documents":
        return {"documents": torch.tensor([0] * 100 + [1] * 150 + [2] * 50).expand(B, T)}
    return {"prefix": 70}


def _mask(kind: str, B: int) -> torch.Tensor:
    i = torch.arange(T)
    causal = i[None] <= i[:, None]
    if kind == "window":
        return causal & (i[:, None] - i[None] < 40)
    if kind == "documents":
        ids = _args(kind, B)["documents"]
        return (ids[:, :, None] == ids[:, None, :])[:, None] & causal
    return causal | ((i[:, None] < 70) & (i[None] < 70))


def _run(kind, q, k, v, g):
    out = attention(q, k, v, causal=True, backend="tiled", **_args(kind, q.shape[0]))
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    return out.detach(), *grads


@pytest.mark.parametrize("kind", ["window", "documents", "prefix"])
@pytest.mark.parametrize("hkv", [6, 2])
def test_units_on_workers_equal_the_inline_run_and_the_reference(
    two_threads, monkeypatch, kind, hkv
):
    B, H = 2, 6
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=gen, requires_grad=True)
    k, v = (torch.randn(B, hkv, T, D, generator=gen, requires_grad=True) for _ in range(2))
    g = torch.randn(B, H, T, D, generator=gen)
    calls = []
    real_run = tiled_backend.run
    monkeypatch.setattr(tiled_backend, "run", lambda units, n: (calls.append((len(units), n)),
                                                                real_run(units, n)))  # fmt: skip
    threaded = _run(kind, q, k, v, g)
    assert calls and all(units > 1 and n == 2 for units, n in calls)  # the workers ran it
    monkeypatch.setattr(tiled_backend, "workers", lambda *tensors: 1)
    inline = _run(kind, q, k, v, g)
    for a, b in zip(threaded, inline, strict=True):
        # the same kernel calls on each unit's heads (a kernel's backward on one thread sums
        # its partial gradients in another order than on two: equal up to rounding)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = reference_attention(q64, k64, v64, mask=_mask(kind, B))
    want = (ref, *torch.autograd.grad((ref * g.double()).sum(), (q64, k64, v64)))
    for a, b in zip(threaded, want, strict=True):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4)


def test_head_units_cover_every_row_and_head_once():
    for B, H, Hkv, n in [(1, 8, 8, 2), (2, 6, 2, 2), (1, 8, 1, 4), (3, 4, 4, 16), (2, 8, 8, 1)]:
        seen = torch.zeros(B, H, dtype=torch.long)
        seen_kv = torch.zeros(B, Hkv, dtype=torch.long)
        for rows, heads, kv in tile_threads.head_units(B, H, Hkv, n):
            seen[rows, heads] += 1
            seen_kv[rows, kv] += 1
            # a unit's query heads are exactly those of its kv heads
            kv_range = range(Hkv)[kv]
            assert range(H)[heads] == range(kv_range.start * (H // Hkv), kv_range.stop * (H // Hkv))
        assert (seen == 1).all() and (seen_kv == 1).all()


def test_the_pool_changes_no_thread_count(two_threads):
    def fresh():
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        return seen[0]

    before = (torch.get_num_threads(), fresh())
    tile_threads.run([lambda: None] * 3, 3)  # a pool of a new size: made now
    assert (torch.get_num_threads(), fresh()) == before
    counts = []
    tile_threads.run([lambda: counts.append(torch.get_num_threads())] * 4, 3)
    assert counts == [1] * 4  # the workers run torch single-threaded


def test_an_error_in_a_unit_reaches_the_caller_after_every_unit_ran():
    ran = []

    def fail():
        raise ValueError("unit failed")

    with pytest.raises(ValueError, match="unit failed"):
        tile_threads.run([fail, lambda: ran.append(1), lambda: ran.append(2)], 2)
    assert sorted(ran) == [1, 2]


def test_inline_where_the_caller_could_see_the_difference(two_threads):
    x = torch.zeros(2)
    with torch.no_grad():
        assert tile_threads.workers(x) == 2
        # a module's weight runs as a Tensor (its __torch_function__ is disabled): the
        # module's projections beside a busy process go to the workers with it
        assert tile_threads.workers(x, torch.nn.Parameter(x)) == 2

        class Logged(torch.Tensor):  # a subclass that may redirect a call: inline
            pass

        assert tile_threads.workers(x, x.as_subclass(Logged)) == 1
        assert tile_threads.workers(x, torch.nn.Buffer(x)) == 2  # (a plain Tensor)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        with Mode():
            assert tile_threads.workers(x) == 1
        seen = []
        tile_threads.run([lambda: seen.append(tile_threads.workers(x))] * 2, 2)
        assert seen == [1, 1]  # from a worker: inline (no unit waits on another)
    assert tile_threads.workers(x) == 1  # grad mode on: autograd records the ops


def test_inference_mode_reaches_the_workers(two_threads):
    q, k, v = (torch.randn(1, 4, T, D) for _ in range(3))
    with torch.inference_mode():
        out = attention(q, k, v, causal=True, window=40, backend="tiled")
    ref, _ = reference_attention(q.double(), k.double(), v.double(), mask=_mask("window", 1))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)


def _general(kind: str, B: int) -> tuple[dict, torch.Tensor]:
    """A call the general tile plan runs (no fast path), and its (B or 1, 1, T, T) mask."""
    i = torch.arange(T)
    causal = i[None] <= i[:, None]
    ids = torch.tensor([0] * 100 + [1] * 150 + [2] * 50).expand(B, T)
    same = (ids[:, :, None] == ids[:, None, :])[:, None]
    if kind == "mask_mod":
        args = {"mask_mod": lambda b, h, qi, ki: (qi - ki) % (3 + h) != 1, "block_size": 60}
        return args, causal & ((i[:, None] - i[None]) % (3 + torch.arange(6)[:, None, None]) != 1)
    if kind == "window+documents":  # (both ways: a causal one runs the masked band)
        return {"window": (40, 15), "documents": ids}, same & (
            (i[None] >= i[:, None] - 40) & (i[None] <= i[:, None] + 15)
        )
    if kind == "bidirectional window":
        return {"window": (30, 20)}, (i[None] >= i[:, None] - 30) & (i[None] <= i[:, None] + 20)
    p = torch.tensor([70, 150])[:B].view(B, 1, 1, 1)  # a prefix per batch row
    return {"prefix": p.view(B)}, causal | ((i[:, None] < p) & (i[None] < p))


@pytest.mark.parametrize(
    "kind", ["mask_mod", "window+documents", "bidirectional window", "per-row prefix"]
)
def test_the_general_plan_on_workers_equals_the_inline_run_and_the_reference(
    two_threads, monkeypatch, kind
):
    B, H, hkv = 2, 6, 3
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, T, D, generator=gen, requires_grad=True)
    k, v = (torch.randn(B, hkv, T, D, generator=gen, requires_grad=True) for _ in range(2))
    bias = torch.randn(1, H, T, T, generator=gen, requires_grad=True)  # the plain tiles' path
    g = torch.randn(B, H, T, D, generator=gen)
    args, mask = _general(kind, B)

    def run(with_bias: bool):
        extra = {"bias": bias} if with_bias else {}
        causal = kind not in ("bidirectional window", "window+documents")
        out = attention(q, k, v, causal=causal, backend="tiled", **args, **extra)
        inputs = (q, k, v, bias) if with_bias else (q, k, v)
        return out.detach(), *torch.autograd.grad((out * g).sum(), inputs)

    calls = []
    real_run = tiled_backend.run
    monkeypatch.setattr(tiled_backend, "run", lambda units, n: (calls.append((len(units), n)),
                                                                real_run(units, n)))  # fmt: skip
    threaded = [run(False), run(True)]  # the kernel's tiles; the plain tiles (a bias gradient)
    # forward, backward and the key gradients' sum (kv heads), and a mask_mod's
    # classification (its query blocks on the workers)
    runs = 8 if kind == "mask_mod" else 6
    assert len(calls) == runs and all(units > 1 and n == 2 for units, n in calls)
    torch.set_num_threads(1)  # one thread: the units run inline, one run of every row
    inline = [run(False), run(True)]
    assert len(calls) == runs + 4 and all(n == 1 for _, n in calls[runs:])
    for got, want in zip(threaded, inline, strict=True):
        for a, b in zip(got, want, strict=True):
            # the same tiles; the key gradients summed from the units' own buffers
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    q64, k64, v64, b64 = (t.detach().double().requires_grad_() for t in (q, k, v, bias))
    rep = H // hkv
    k64r, v64r = k64.repeat_interleave(rep, 1), v64.repeat_interleave(rep, 1)
    for got, with_bias in zip(threaded, (False, True), strict=True):
        ref, _ = reference_attention(q64, k64r, v64r, mask=mask, bias=b64 if with_bias else None)
        inputs = (q64, k64, v64, b64) if with_bias else (q64, k64, v64)
        want = (ref, *torch.autograd.grad((ref * g.double()).sum(), inputs))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4)


def test_row_groups_cover_every_row_once_in_order():
    for weights, n in [
        ([1] * 10, 2),
        (list(range(9)), 2),
        ([0, 0, 0], 4),
        ([5], 3),
        ([9, 1, 1], 8),
    ]:
        groups = tile_threads.row_groups(weights, n)
        assert [j for g in groups for j in g] == list(range(len(weights)))
        assert all(len(g) for g in groups) and len(groups) <= max(1, 2 * n)
    assert tile_threads.row_groups([1] * 10, 1) == [range(10)]
    # about equal weight: 8 equal rows on 2 workers, 4 runs of 2
    assert tile_threads.row_groups([3] * 8, 2) == [
        range(0, 2),
        range(2, 4),
        range(4, 6),
        range(6, 8),
    ]


def test_per_call_runs_a_small_call_inline_only_on_free_cores(monkeypatch):
    small, large = tile_threads.SMALL_PAIRS - 1, tile_threads.SMALL_PAIRS
    monkeypatch.setattr(tile_threads, "_cores", lambda: 2)
    for running, n, pairs, want in [
        (1, 2, small, 1),  # this thread alone: inline
        (2, 2, small, 1),  # and one more (libgomp's helper spinning after a region)
        (3, 2, small, 2),  # a thread of another process: the workers
        (1, 2, large, 2),  # a large call: the workers whatever the probe
        (1, 1, small, 1),  # one thread asked for: inline as before
        (None, 2, small, 2),  # nothing to read: the workers
        (3, 4, small, 2 * 2),  # at most the cores: 3 runnable on 2 cores is busy
    ]:
        monkeypatch.setattr(tile_threads, "_runnable", lambda running=running: running)
        assert tile_threads.per_call(n, pairs) == want, (running, n, pairs)


def test_the_probe_reads_this_machine():
    # (the autouse fixture's stand-in is the patched name; the real one is kept here)
    assert tile_threads._cores() >= 1
    if not Path("/proc/loadavg").exists():  # not Linux: nothing to read, the workers
        assert _real_runnable() is None
        return
    assert _real_runnable() >= 1  # this thread is running while it reads


def _module_run(m, x, g, args):
    y = m(x, **args)
    return y.detach(), *torch.autograd.grad((y * g).sum(), (x, *m.parameters()))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["window", "documents"])
def test_the_per_call_choice_equals_the_reference_function_and_module(monkeypatch, threads, kind):
    """Free cores (a small call runs inline) and taken cores (on the workers): the function's
    and MultiHeadAttention's forward and backward against the fp64 reference."""
    from multihead import MultiHeadAttention

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        chosen = []
        real = tiled_backend.per_call
        monkeypatch.setattr(
            tiled_backend, "per_call", lambda n, p: chosen.append(real(n, p)) or chosen[-1]
        )
        B, H, Tm, E = 2, 4, 1024, 8  # the module at the tiled backend's least length
        gen = torch.Generator().manual_seed(2)
        q = torch.randn(B, H, T, D, generator=gen, requires_grad=True)
        k, v = (torch.randn(B, H, T, D, generator=gen, requires_grad=True) for _ in range(2))
        g = torch.randn(B, H, T, D, generator=gen)
        m = MultiHeadAttention(E, H, causal=True).double()
        x = torch.randn(B, Tm, E, generator=gen, dtype=torch.float64, requires_grad=True)
        gm = torch.randn(B, Tm, E, generator=gen, dtype=torch.float64)
        ids = torch.tensor([0] * 300 + [1] * 500 + [2] * 224).expand(B, Tm)
        margs = {"window": 100} if kind == "window" else {"documents": ids}
        want_m = None
        for running in (1, 10**6):  # free cores, then taken ones
            monkeypatch.setattr(tile_threads, "_runnable", lambda running=running: running)
            got = _run(kind, q, k, v, g)
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            ref, _ = reference_attention(q64, k64, v64, mask=_mask(kind, B))
            want = (ref, *torch.autograd.grad((ref * g.double()).sum(), (q64, k64, v64)))
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4)
            got_m = _module_run(m, x, gm, margs)
            if want_m is None:
                # fp64 reference: the same module under the equivalent dense mask (SDPA's
                # math on fp64, no structure: the tiled backend does not run)
                i = torch.arange(Tm)
                allowed = i[None] <= i[:, None]
                if kind == "window":
                    allowed = allowed & (i[:, None] - i[None] < 100)
                else:
                    allowed = (ids[:, :, None] == ids[:, None, :])[:, None] & allowed
                want_m = _module_run(m, x, gm, {"mask": allowed})
            for a, b in zip(got_m, want_m, strict=True):
                torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)
        # free cores: inline (1); taken: the workers (2), or inline at one thread
        per_pass = len(chosen) // 2
        assert chosen[:per_pass] == [1] * per_pass
        assert chosen[per_pass:] == [threads] * per_pass
    finally:
        torch.set_num_threads(before)


def test_recorded_choices_lists_each_fast_path_call_of_its_block(monkeypatch, two_threads):
    """`recorded_choices`: the choice of every fast-path call (forward, then backward) made
    inside the block, 1 where it ran inline; nothing outside it; the values unchanged."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, T, D, generator=gen, requires_grad=True) for _ in range(3))
    assert tile_threads._choices.get() is None
    monkeypatch.setattr(tile_threads, "_runnable", lambda: 1)  # free cores: a small call inline
    with tile_threads.recorded_choices() as free:
        out = attention(q, k, v, causal=True, window=40, backend="tiled")
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    monkeypatch.setattr(tile_threads, "_runnable", lambda: 10**6)  # taken: the workers
    with tile_threads.recorded_choices() as taken:
        out_w = attention(q, k, v, causal=True, window=40, backend="tiled")
        grads_w = torch.autograd.grad(out_w.sum(), (q, k, v))
    attention(q, k, v, causal=True, window=40, backend="tiled")  # outside any block: not recorded
    assert free == [1, 1] and taken == [2, 2]
    assert tile_threads._choices.get() is None
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    i = torch.arange(T)
    allowed = (i[None] <= i[:, None]) & (i[:, None] - i[None] < 40)
    ref, _ = reference_attention(q64, k64, v64, mask=allowed)
    want = (ref, *torch.autograd.grad(ref.sum(), (q64, k64, v64)))
    for got in ((out, *grads), (out_w, *grads_w)):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4)


def test_workers_let_go_of_their_units(two_threads):
    """No worker holds a unit after the call: a unit holds views of the caller's tensors,
    and autograd takes a gradient into .grad only where nothing else holds it."""
    import functools
    import weakref

    class Held:
        pass

    held = [Held() for _ in range(5)]
    refs = [weakref.ref(h) for h in held]
    tile_threads.run([functools.partial(lambda h: None, h) for h in held], 2)
    del held
    assert [r() for r in refs] == [None] * 5


@pytest.mark.parametrize("kind", ["window", "documents", "prefix"])
def test_a_backward_on_the_workers_hands_its_gradients_to_grad_uncopied(two_threads, kind):
    """A leaf's .grad after a backward whose units ran on the workers is the gradient the
    backward made, taken, not a copy of it (a worker holding its last unit made autograd
    copy each of dq, dk, dv)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, T, 16, requires_grad=True) for _ in range(3))
    made = {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        t.register_hook(lambda g, name=name: made.__setitem__(name, g.data_ptr()))
    with tile_threads.recorded_choices() as seen:
        attention(q, k, v, causal=True, backend="tiled", **_args(kind, 2)).sum().backward()
    assert seen and all(n == 2 for n in seen)  # (on the workers)
    assert {n: t.grad.data_ptr() for n, t in (("q", q), ("k", k), ("v", v))} == made
