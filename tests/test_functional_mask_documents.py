"""Documents given as a mask function (`ids[q] == ids[k]`, causal): the tiled backend
recognises the mask EXACTLY (`functional.mask_documents`) and runs the `documents=` fast path
on the recovered ids; values and gradients against the fp64 reference under a dense mask
written out pair by pair (function, held plan, module; one and two threads); a near miss of
any kind stays on the general plan, with the right values."""

import pytest
import torch

from helpers_structure import B, H, qkv
from multihead import MultiHeadAttention, attention
from multihead.functional import block_mask
from multihead.functional.backends import tiled as tiled_backend
from test_functional_mask_mod import check

from conftest import assert_close
from reference import reference_attention

N, BLOCK = 96, 16
# per batch row, contiguous runs; boundaries inside tiles and on them, one of 1 position
IDS = [[0] * 21 + [1] * 43 + [2] * 1 + [3] * 31, [5] * 32 + [6] * 64]
IDS_T = torch.tensor(IDS)  # (B, N)
SAME = torch.tensor(IDS[0])  # (N,): every batch row alike


def per_row(b, h, q, k):
    return (k <= q) & (IDS_T[b, q] == IDS_T[b, k])


def shared(b, h, q, k):
    return (k <= q) & (SAME[q] == SAME[k])


def unordered(b, h, q, k):  # documents alone: the call's causality makes them causal
    return IDS_T[b, q] == IDS_T[b, k]


def dense(ids: list[list[int]], heads: int = 1, causal: bool = True) -> torch.Tensor:
    """(B, heads, N, N) booleans, pair by pair."""
    rows = [
        [[ids[b][i] == ids[b][j] and (j <= i or not causal) for j in range(N)] for i in range(N)]
        for b in range(B)
    ]
    return torch.tensor(rows)[:, None].expand(B, heads, N, N)


@pytest.fixture
def paths(monkeypatch):
    calls = {"segments": 0, "spans": 0, "tiles": 0}

    def counting(name, real):
        def fn(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return fn

    monkeypatch.setattr(
        tiled_backend, "segments_forward", counting("segments", tiled_backend.segments_forward)
    )
    monkeypatch.setattr(tiled_backend, "run_forward", counting("spans", tiled_backend.run_forward))
    monkeypatch.setattr(
        tiled_backend, "kernel_forward", counting("tiles", tiled_backend.kernel_forward)
    )
    return calls


@pytest.mark.parametrize(
    "fn, ids, causal",
    [
        (per_row, IDS, False),
        (per_row, IDS, True),
        (shared, [IDS[0]] * B, False),
        (unordered, IDS, True),
    ],
    ids=["per-row", "per-row-causal-call", "shared", "ids-only-causal-call"],
)
@pytest.mark.parametrize("held", [True, False], ids=["held", "function"])
@pytest.mark.parametrize("hkv", [H, 1])
def test_documents_as_a_mask_function_run_the_documents_path(
    paths, threads, fn, ids, causal, held, hkv
):
    q, k, v = qkv(N, N, hkv)
    if held:
        plan = block_mask(fn, None if fn is shared else B, None, N, N, block_size=BLOCK)
        if not causal:
            expect = torch.tensor(ids[:1] if fn is shared else ids)
            assert torch.equal(plan.documents, expect - expect[:, :1])
            assert "causal documents" in repr(plan)
        given = {"mask_mod": plan}
    else:
        given = {"mask_mod": fn, "block_size": BLOCK}
    out = attention(q, k, v, causal=causal, backend="tiled", **given)
    assert paths["segments"] > 0 and paths["spans"] == 0 and paths["tiles"] == 0
    ref, _ = reference_attention(q, k, v, mask=dense(ids))
    check(out, ref, (q, k, v))
    assert_close(out, attention(q, k, v, causal=True, documents=torch.tensor(ids)))


def _near(change):
    """Documents of IDS[0] with one thing changed."""

    def fn(b, h, q, k):
        return change(b, h, q, k, (k <= q) & (SAME[q] == SAME[k]))

    return fn


NEAR_MISSES = {
    "one-key-missing": _near(lambda b, h, q, k, m: m & ~((q == 50) & (k == 30))),
    "one-key-past-the-diagonal": _near(lambda b, h, q, k, m: m | ((q == 40) & (k == 41))),
    "one-key-across-documents": _near(lambda b, h, q, k, m: m | ((q == 70) & (k == 10))),
    "one-tile-different": _near(lambda b, h, q, k, m: m & ~((q >= 48) & (q < 64) & (k < 32))),
    "a-head-differs": _near(lambda b, h, q, k, m: m & ~((h == 2) & (q == 80) & (k == 70))),
    "a-batch-row-differs": _near(lambda b, h, q, k, m: m & ~((b == 1) & (q == 80) & (k == 70))),
    "not-causal-inside": _near(lambda b, h, q, k, m: SAME[q] == SAME[k]),
    "a-gap": _near(lambda b, h, q, k, m: m & ((k < 60) | (k > 62) | (q == k))),
    "a-row-sees-nothing": _near(lambda b, h, q, k, m: m & (q != 33)),
    "a-document-in-two-runs": lambda b, h, q, k: (
        (k <= q) & ((q < 40) | (q >= 70)) == ((k < 40) | (k >= 70))
    ),
}


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_a_near_miss_stays_on_the_general_plan(paths, name):
    fn = NEAR_MISSES[name]
    q, k, v = qkv(N, N)
    plan = block_mask(fn, B, H, N, N, block_size=BLOCK)
    assert plan.documents is None
    # (a causal call cuts these two into documents: then they are recognised)
    cut = name in ("one-key-past-the-diagonal", "not-causal-inside")
    assert (plan.documents_for(True) is not None) == cut
    i = torch.arange(N)
    want = fn(
        torch.arange(B).view(B, 1, 1, 1),
        torch.arange(H).view(1, H, 1, 1),
        i.view(-1, 1),
        i.view(1, -1),
    )
    want = want.expand(B, H, N, N)  # (the function itself, on the whole grid)
    for given in ({"mask_mod": plan}, {"mask_mod": fn, "block_size": BLOCK}):
        out = attention(q, k, v, backend="tiled", **given)
        assert paths["segments"] == 0
        ref, _ = reference_attention(q, k, v, mask=want)
        check(out, ref, (q, k, v))


def test_the_module_runs_a_held_documents_plan(paths, threads):
    T, C, heads = 1024, 16, 2  # (auto leaves smaller calls to sdpa under the dense mask)
    ids = torch.tensor([[0] * 300 + [1] * 500 + [2] * 224, [4] * 700 + [5] * 324])  # (B, T)

    def fn(b, h, q, k):
        return (k <= q) & (ids[b, q] == ids[b, k])

    torch.manual_seed(0)
    mha = MultiHeadAttention(C, heads, causal=True, dtype=torch.float64)
    x = torch.randn(B, T, C, dtype=torch.float64, requires_grad=True)
    plan = block_mask(fn, B, None, T, T)
    got = mha(x, mask_mod=plan)
    assert paths["segments"] > 0 and paths["spans"] == 0 and paths["tiles"] == 0
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    want = mha(x, mask=((ids[:, :, None] == ids[:, None]) & causal)[:, None], causal=False)
    assert_close(got, want)
    g_got = torch.autograd.grad(got.square().sum(), (x, mha.in_proj.weight))
    g_want = torch.autograd.grad(want.square().sum(), (x, mha.in_proj.weight))
    for a, b in zip(g_got, g_want, strict=True):
        assert_close(a, b)
