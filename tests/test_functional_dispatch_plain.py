"""`dispatch_plain`: a plain call (q, k, v, causality, dropout; a module's plain path) gives
exactly what `dispatch(make_call(...))` gives, runs torch's kernel directly only where `auto`
would hand the call to the built-in sdpa backend as one kernel call, and otherwise goes the
validated way (a registered backend asked first, an empty length, causality that needs a
mask, a mask or a window)."""

import importlib

import pytest
import torch

from helpers_spies import count_calls
from multihead import MultiHeadAttention
from multihead.functional.attention import dispatch, dispatch_plain
from multihead.functional.backends import get_backend, register_backend, unregister_backend
from multihead.functional.call import make_call
from multihead.modules.cache import KVCache

from reference import reference_attention

B, H, HKV, D = 2, 4, 2, 8
# (the package's `attention` name is the function; the module is reached by its path)
attention_module = importlib.import_module("multihead.functional.attention")


def qkv(tq, tk, kv_heads=HKV, dtype=torch.float64):
    g = torch.Generator().manual_seed(tq * 100 + tk)
    q = torch.randn(B, H, tq, D, dtype=dtype, generator=g)
    k, v = (torch.randn(B, kv_heads, tk, D, dtype=dtype, generator=g) for _ in range(2))
    return q, k, v


@pytest.fixture
def general(monkeypatch):
    """Counts dispatch_plain's calls that took the validated way (make_call then dispatch;
    the tests' own references call make_call from functional.call, not counted)."""
    return count_calls(monkeypatch, attention_module, {"make_call": "general"})


# (Tq, Tk, causal): square, one query (a decode step), cross lengths, causal prefill chunks
CASES = [(5, 5, False), (5, 5, True), (1, 7, True), (1, 7, False), (3, 7, False), (3, 7, True)]


@pytest.mark.parametrize("kv_heads", [H, HKV])
@pytest.mark.parametrize("tq, tk, causal", CASES)
def test_plain_calls_equal_the_validated_way_and_the_reference(general, tq, tk, causal, kv_heads):
    q, k, v = qkv(tq, tk, kv_heads)
    got = dispatch_plain(q, k, v, causal, 0.0)
    # causality the kernel cannot express alone (bottom-right, 1 < Tq != Tk) needs a mask
    needs_mask = causal and tq not in (1, tk)
    assert general["general"] == needs_mask
    want, _ = dispatch(make_call(q, k, v, causal=causal, qkv_checked=True))
    assert torch.equal(got, want)
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq) if causal else None
    rep = H // kv_heads
    ref, _ = reference_attention(
        q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), mask=mask
    )
    torch.testing.assert_close(got, ref)


def test_dropout_draws_as_the_validated_way_does(general):
    q, k, v = qkv(6, 6, dtype=torch.float32)
    torch.manual_seed(7)
    got = dispatch_plain(q, k, v, True, 0.3)
    torch.manual_seed(7)
    want, _ = dispatch(make_call(q, k, v, causal=True, dropout_p=0.3, qkv_checked=True))
    assert general["general"] == 0
    assert torch.equal(got, want)


def test_empty_lengths_mask_and_window_take_the_validated_way(general):
    q, k, v = qkv(0, 4)
    assert dispatch_plain(q, k, v, False, 0.0).shape == (B, H, 0, D)
    q, k, v = qkv(4, 4)
    keys = torch.tensor([[True, True, False, True], [True] * 4])[:, None, None, :]
    got = dispatch_plain(q, k, v, True, 0.0, keys)
    want, _ = dispatch(make_call(q, k, v, mask=keys, causal=True, qkv_checked=True))
    torch.testing.assert_close(got, want)
    got = dispatch_plain(q, k, v, True, 0.0, None, 2)
    want, _ = dispatch(make_call(q, k, v, causal=True, window=2, qkv_checked=True))
    torch.testing.assert_close(got, want)
    assert general["general"] == 3


def _decode(m: MultiHeadAttention) -> torch.Tensor:
    """A prefill of 5 tokens then one decode step through a static cache; the step's output."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, m.embed_dim)
    cache = KVCache(1, m.num_kv_heads, m.head_dim, max_length=8)
    with torch.no_grad():
        m(x[:, :5], cache=cache)
        return m(x[:, 5:], cache=cache)


def test_a_backend_registered_above_sdpa_runs_the_modules_plain_calls():
    m = MultiHeadAttention(32, 4, causal=True).eval()
    plain = _decode(m)
    seen = []

    def doubling(call):
        seen.append(tuple(call.q.shape))
        out, _ = get_backend("sdpa").run(call)
        return out * 2, None

    register_backend("doubling", doubling, priority=100)
    try:
        doubled = _decode(m)
    finally:
        unregister_backend("doubling")
    assert seen == [(1, 4, 5, 8), (1, 4, 1, 8)]  # the prefill and the step both reached it
    bias = m.out_proj.bias
    torch.testing.assert_close(doubled - bias, 2 * (plain - bias))
    torch.testing.assert_close(_decode(m), plain)  # and nothing of it stays behind


def test_sdpa_replaced_by_name_runs_the_modules_plain_calls():
    m = MultiHeadAttention(32, 4, causal=True).eval()
    original = get_backend("sdpa")
    seen = []

    def spy(call):
        seen.append(tuple(call.q.shape))
        return original.run(call)

    register_backend(
        "sdpa", spy, why_not=original.why_not, priority=original.priority, replace=True
    )
    try:
        got = _decode(m)
    finally:
        register_backend(
            "sdpa", original.run, why_not=original.why_not, priority=original.priority,
            replace=True,
        )  # fmt: skip
    assert seen == [(1, 4, 5, 8), (1, 4, 1, 8)]
    torch.testing.assert_close(got, _decode(m))
