"""The tiled backend's fast paths on worker threads (`functional/backends/tile_threads.py`):
the same numbers as the calling thread's own run, the fp64 reference, and no thread count of
the caller's changed."""

import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from multihead import attention
from multihead.functional.backends import tile_threads
from multihead.functional.backends import tiled as tiled_backend

from reference import reference_attention

T, D = 300, 8


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
        assert tile_threads.workers(x, torch.nn.Parameter(x)) == 1  # a subclass

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
