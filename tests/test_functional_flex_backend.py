"""The flex backend (torch's flex_attention with a BlockMask built from the call's structure)
against the fp64 textbook reference, with the structure written out pair by pair: every kind
of structure, masks that empty rows, bias, grouped-query heads, cross lengths (bottom-right),
bf16; what it refuses and why; and where `auto` sends calls.

No GPU here: these run torch's compiled CPU flex_attention (forward only: torch has no CPU
backward for it, which flex_why_not says). On CUDA, auto picks this backend for structured
calls; that path is not run by this suite."""

import dataclasses

import pytest
import torch

from multihead import attention
from multihead.functional import explain
from multihead.functional.backends import flex as flex_backend
from multihead.functional.backends import registry, select_backend
from multihead.functional.call import make_call

from conftest import assert_close
from reference import reference_attention, structure_mask_pairwise

B, H, T, D = 2, 4, 64, 16
DOCS = [[0] * 20 + [1] * 30 + [2] * 14, [0] * 64]


@pytest.fixture(autouse=True)
def _fresh_compile_cache():
    """Each case compiles its own graph: without a reset, dynamo's recompile limit would send
    later cases to flex_attention's uncompiled fallback, which this suite should not test."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def qkv(Hkv=H, tq=T, tk=T, dtype=torch.float32):
    return (
        torch.randn(B, H, tq, D, dtype=dtype),
        torch.randn(B, Hkv, tk, D, dtype=dtype),
        torch.randn(B, Hkv, tk, D, dtype=dtype),
    )


CASES = {
    "causal window": dict(causal=True, window=9),
    "two-sided window": dict(window=(3, 6)),
    "documents, causal": dict(causal=True, documents=DOCS),
    "documents": dict(documents=DOCS),
    "int prefix": dict(causal=True, prefix=17),
    "prefix per row": dict(causal=True, prefix=[5, 40]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_structure_matches_the_reference(name):
    args = CASES[name]
    q, k, v = qkv()
    call_args = dict(args)
    if "documents" in args:
        call_args["documents"] = torch.tensor(args["documents"])
    if isinstance(args.get("prefix"), list):
        call_args["prefix"] = torch.tensor(args["prefix"])
    got = attention(q, k, v, backend="flex", **call_args)
    allowed = structure_mask_pairwise(B, T, T, **args)
    want, _ = reference_attention(q, k, v, mask=allowed)
    assert_close(got, want, torch.float32)


def test_one_process_runs_many_windows_and_lengths():
    # (no reset between calls, as in a user's process: with torch's automatic dynamic
    # shapes the second window made its ints symbolic, and every flex call after it failed
    # in torch's C++ code generation)
    for tq, window, causal in [(64, (3, 6), False), (64, (2, 5), False), (64, 4, True),
                               (48, 4, True)]:  # fmt: skip
        q, k, v = qkv(tq=tq, tk=tq)
        got = attention(q, k, v, causal=causal, window=window, backend="flex")
        allowed = structure_mask_pairwise(B, tq, tq, causal=causal, window=window)
        assert_close(got, reference_attention(q, k, v, mask=allowed)[0], torch.float32)


def test_mask_emptying_rows_gives_zeros_and_bias_is_added():
    q, k, v = qkv()
    key_mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    key_mask[0, :, :, :40] = False  # with a window of 8, rows 0..39 of batch 0 see nothing
    bias = torch.randn(1, H, T, T)
    got = attention(q, k, v, causal=True, window=8, mask=key_mask, bias=bias, backend="flex")
    allowed = structure_mask_pairwise(B, T, T, causal=True, window=8) & key_mask
    want, _ = reference_attention(q, k, v, mask=allowed, bias=bias)
    assert not got.isnan().any()
    assert torch.equal(got[0, :, :40], torch.zeros_like(got[0, :, :40]))
    assert_close(got, want, torch.float32)


def test_grouped_query_heads_cross_lengths_and_a_mask_mod():
    q, k, v = qkv(Hkv=2, tq=24, tk=T)  # queries are the last 24 positions (bottom-right)

    def every_other_per_head(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) % (h + 2) == 0

    got = attention(q, k, v, causal=True, window=20, mask_mod=every_other_per_head, backend="flex")
    allowed = structure_mask_pairwise(B, 24, T, causal=True, window=20)
    p = torch.arange(24)[:, None] + T - 24
    j = torch.arange(T)[None, :]
    per_head = torch.stack([(p - j) % (h + 2) == 0 for h in range(H)])[None]  # (1, H, 24, T)
    want, _ = reference_attention(q, k, v, mask=allowed & per_head)
    assert_close(got, want, torch.float32)


def test_bfloat16():
    q, k, v = qkv(dtype=torch.bfloat16)
    got = attention(q, k, v, causal=True, window=9, backend="flex")
    want, _ = reference_attention(
        q, k, v, mask=structure_mask_pairwise(B, T, T, causal=True, window=9)
    )
    assert got.dtype == torch.bfloat16
    assert_close(got, want, torch.bfloat16)


def test_runs_inside_torch_compile_fullgraph():
    q, k, v = qkv()

    def f(q, k, v):
        return attention(q, k, v, causal=True, window=9, backend="flex")

    got = torch.compile(f, fullgraph=True)(q, k, v)
    want, _ = reference_attention(
        q, k, v, mask=structure_mask_pairwise(B, T, T, causal=True, window=9)
    )
    assert_close(got, want, torch.float32)


def test_nan_reaches_the_rows_that_read_it():
    # flex_attention itself drops NaN scores (a NaN query row came out as zeros): the backend
    # follows multihead's rule, as the tiled backend does (tests/test_hostile_numerics.py).
    T2 = 256
    q, k, v = (torch.randn(1, 1, T2, D) for _ in range(3))
    q[0, 0, 5] = float("nan")
    k[0, 0, 200] = float("nan")  # read by rows 200 .. 207 (window 8)
    bias = torch.zeros(1, 1, T2, T2)
    bias[0, 0, 30, 28] = float("nan")  # an allowed pair of row 30
    got = attention(q, k, v, causal=True, window=8, bias=bias, backend="flex")[0, 0]
    nan_rows = got.isnan().any(dim=-1)
    assert nan_rows.nonzero().flatten().tolist() == [5, 30, *range(200, 208)]  # those alone
    tiled = attention(q, k, v, causal=True, window=8, bias=bias, backend="tiled")[0, 0]
    assert not tiled[64:128].isnan().any()
    assert_close(got[64:128], tiled[64:128], torch.float32)


# -- what it refuses, and where auto sends calls -----------------------------------------------


def test_refusals_name_the_reason():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="no backward on CPU"):
        attention(q.requires_grad_(), k, v, causal=True, window=9, backend="flex")
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"float32, float16 and bfloat16, got torch\.float64"):
        attention(q.double(), k.double(), v.double(), window=9, backend="flex")
    with pytest.raises(ValueError, match="no attention dropout"):
        attention(q, k, v, window=9, dropout_p=0.1, backend="flex")
    with pytest.raises(ValueError, match="cannot return attention weights"):
        attention(q, k, v, window=9, return_weights=True, backend="flex")
    with torch.no_grad():  # the same call without gradients runs
        attention(q.requires_grad_(), k, v, causal=True, window=9, backend="flex")


def test_auto_keeps_cpu_calls_off_flex_and_would_send_structured_cuda_calls_to_it(monkeypatch):
    big = torch.randn(1, 2, 1024, 8)
    assert explain(big, big, big, causal=True, window=64).chosen == "tiled"
    with torch.no_grad():
        assert explain(big, big, big, causal=True, window=64, backend="flex").chosen == "flex"
    call = make_call(big, big, big, causal=True, window=64)
    assert flex_backend.flex_prefer(call) is False  # CPU: the tiled backend's
    assert flex_backend.flex_prefer(make_call(big, big, big, causal=True)) is False
    # On CUDA the device test passes; with the tiled backend out of the way (as it is there),
    # auto reaches flex before sdpa for a large structured call, never for a plain or small one.
    flex = registry.get_backend("flex")
    on_cuda = dataclasses.replace(flex, prefer=flex_backend.pays)  # (less the device test)
    monkeypatch.setitem(registry._BACKENDS, "flex", on_cuda)
    others = [b for b in registry._BACKENDS.values() if b.name not in ("tiled", "flex")]
    monkeypatch.setattr(registry, "_ORDER", sorted([on_cuda, *others], key=lambda b: -b.priority))
    with torch.no_grad():
        assert select_backend(call, "auto").name == "flex"
        assert select_backend(make_call(big, big, big, causal=True), "auto").name == "sdpa"
        small = torch.randn(1, 2, 256, 8)  # 64K pairs: sdpa under the dense mask
        assert select_backend(make_call(small, small, small, window=16), "auto").name == "sdpa"


@pytest.mark.gpu
def test_cuda_auto_runs_flex_forward_and_backward_as_the_dense_mask():
    dev = "cuda"
    q, k, v = (torch.randn(1, 4, 1024, 64, device=dev, requires_grad=True) for _ in range(3))
    assert explain(q, k, v, causal=True, window=128).chosen == "flex"
    got = attention(q, k, v, causal=True, window=128)
    i, j = torch.arange(1024, device=dev)[:, None], torch.arange(1024, device=dev)[None, :]
    allowed = (j <= i) & (j > i - 128)
    want = attention(q, k, v, mask=allowed, backend="sdpa")
    assert_close(got, want, torch.float32)
    g = torch.randn_like(got)
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g), strict=True
    ):
        assert_close(a, b, torch.float32)
