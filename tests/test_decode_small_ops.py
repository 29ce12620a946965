"""A decoding step's small ops in C (one row): RMSNorm within float32 rounding of F.rms_norm
and of the float64 textbook, RoPE bit for bit as `rotate_heads_`, the one-query attention over
the cache within float32 rounding of SDPA and of the float64 textbook; the torch paths wherever
a gradient, several rows or another dtype is involved."""

import platform

import pytest
import torch
import torch.nn.functional as F

import multihead.modules.attention_plain as attention_plain
import multihead.modules.feedforward as feedforward
import multihead.modules.norm as norm_module
from multihead import CausalLM, LMConfig
from multihead.modules.norm import RMSNorm
from multihead.modules.quantized import QuantizedLinear, kernels, kernels_available
from multihead.modules.quantized.linear import linear_pair
from test_quantized_prefill import CASES, packed_matrix, textbook

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler here")


def _textbook(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    h = x.double() / (x.double().pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return (h if w is None else h * w.double()).float()


@pytest.mark.parametrize("width", [48, 576, 77])
@pytest.mark.parametrize("weight", [True, False])
def test_one_row_rmsnorm_is_f_rms_norm_within_rounding(width, weight, monkeypatch):
    torch.manual_seed(width)
    norm = RMSNorm(width, eps=1e-5, elementwise_affine=weight)
    if weight:
        with torch.no_grad():
            norm.weight.normal_()
    called = []
    kernel = norm_module.rms_norm_row
    monkeypatch.setattr(norm_module, "rms_norm_row", lambda *a: called.append(1) or kernel(*a))
    for shape in ((width,), (1, width), (1, 1, width)):
        x = torch.randn(shape) * 3
        with torch.no_grad():
            got = norm(x)
        assert got.shape == x.shape and got.dtype == torch.float32
        ref = F.rms_norm(x, (width,), norm.weight, 1e-5)
        torch.testing.assert_close(got, ref, rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(got, _textbook(x, norm.weight, 1e-5), rtol=2e-6, atol=2e-6)
    assert len(called) == 3
    norm.eps = 0.5  # eps read per call
    x = torch.randn(1, width)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), _textbook(x, norm.weight, 0.5), rtol=2e-6, atol=2e-6)


def test_rmsnorm_keeps_the_torch_path_for_rows_gradients_and_views(monkeypatch):
    norm = RMSNorm(32)
    with torch.no_grad():
        norm.weight.normal_()
    monkeypatch.setattr(norm_module, "rms_norm_row", lambda *a: pytest.fail("kernel called"))
    x = torch.randn(2, 32)
    with torch.no_grad():
        assert torch.equal(norm(x), F.rms_norm(x, (32,), norm.weight, 1e-6))  # two rows
        col = torch.randn(32, 2)[:, :1].t()  # one row, not contiguous
        assert torch.equal(norm(col), F.rms_norm(col, (32,), norm.weight, 1e-6))
    y = torch.randn(1, 32)
    out = norm(y)  # the weight requires a gradient: recorded by torch's ops
    out.sum().backward()
    assert norm.weight.grad is not None


def _model() -> CausalLM:
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=61, dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
        position="rope", norm="rmsnorm", mlp="swiglu", bias=False,
    )  # fmt: skip
    return CausalLM(cfg).eval()


def _decode(model: CausalLM, ids: torch.Tensor, steps: int = 3) -> list[torch.Tensor]:
    caches = model.make_caches(1, max_length=ids.shape[1] + steps)
    out = [model(ids, caches=caches)[:, -1]]
    for _ in range(steps):
        out.append(model(out[-1].argmax(-1)[:, None], caches=caches)[:, -1])
    return out


def test_one_row_rope_is_rotate_heads_bit_for_bit(monkeypatch):
    model, ids = _model(), torch.randint(0, 61, (1, 5))
    monkeypatch.setattr(norm_module, "rms_norm_row", lambda *a: None)  # the norm as before
    rotated = []
    kernel = attention_plain.rope_rows_
    monkeypatch.setattr(attention_plain, "rope_rows_", lambda *a: rotated.append(1) or kernel(*a))
    with torch.no_grad():
        got = _decode(model, ids)
        assert len(rotated) == 3 * 2  # three one-token steps, two layers
        monkeypatch.setattr(attention_plain, "rope_rows_", lambda *a: False)
        expected = _decode(model, ids)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


def test_decoding_with_the_small_ops_in_c_matches_torch_ops_and_hooks(monkeypatch):
    model, ids = _model(), torch.randint(0, 61, (1, 6))
    with torch.no_grad():
        got = _decode(model, ids)
        with monkeypatch.context() as patch:
            patch.setattr(norm_module, "rms_norm_row", lambda *a: None)
            patch.setattr(attention_plain, "rope_rows_", lambda *a: False)
            patch.setattr(attention_plain, "_append_attend_row", lambda *a: None)
            patch.setattr(attention_plain, "_attend_one_row", lambda *a: None)
            expected = _decode(model, ids)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
        # run_with_cache on a one-token step (the general path: SDPA) sees the plain step's
        # values within float32 rounding, and its norms
        caches = model.make_caches(1, max_length=8)
        model(ids, caches=caches)
        token = got[0].argmax(-1)[:, None]
        plain_caches = model.make_caches(1, max_length=8)
        model(ids, caches=plain_caches)
        plain = model(token, caches=plain_caches)
        logits, cache = model.run_with_cache(token, caches=caches)
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)
    assert any("hook_normalized" in name for name in cache)


def _textbook_attention(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    w = torch.softmax(q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return w @ v  # (1, H, 1, D)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "keys"),
    [(9, 3, 64, 128), (4, 4, 16, 1), (6, 2, 40, 37), (2, 1, 8, 1500), (8, 2, 64, 600)],
)
def test_one_query_attention_over_a_cache_is_sdpa_within_rounding(heads, kv_heads, dim, keys):
    torch.manual_seed(keys)
    buffer = torch.randn(1, 2 * kv_heads, keys + 9, dim) * 2  # a cache's buffer, longer than used
    k = buffer[:, :kv_heads].narrow(2, 0, keys)
    v = buffer[:, kv_heads:].narrow(2, 0, keys)
    q = torch.randn(1, heads, 1, dim) * 2
    got = attention_plain._attend_one_row(q, k, v)
    assert got is not None and got.shape == (1, 1, heads * dim)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, enable_gqa=kv_heads != heads
    )  # (1, H, 1, D) -> (1, 1, H D)
    torch.testing.assert_close(got, ref.transpose(1, 2).reshape(1, 1, -1), rtol=1e-5, atol=1e-5)
    book = _textbook_attention(q, k, v).transpose(1, 2).reshape(1, 1, -1).float()
    torch.testing.assert_close(got, book, rtol=1e-5, atol=1e-5)


def test_one_query_attention_declines_what_it_does_not_read():
    q, kv = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 5, 16)
    k, v = kv[:, :2], kv[:, 2:]
    assert attention_plain._attend_one_row(q, k, v) is not None
    assert attention_plain._attend_one_row(q.double(), k.double(), v.double()) is None
    assert attention_plain._attend_one_row(q, k.transpose(2, 3).transpose(2, 3), v) is not None
    assert attention_plain._attend_one_row(q, torch.randn(1, 2, 16, 5).transpose(2, 3), v) is None
    assert (
        attention_plain._attend_one_row(q, torch.randn(1, 3, 5, 16), torch.randn(1, 3, 5, 16))
        is None
    )
    assert attention_plain._attend_one_row(q, k[:, :, :0], v[:, :, :0]) is None
    grad = q.clone().requires_grad_()
    assert attention_plain._attend_one_row(grad, k, v) is None
    with torch.no_grad():
        assert attention_plain._attend_one_row(grad, k, v) is not None


@pytest.mark.parametrize(("form", "stored"), CASES)
def test_swiglu_packed_row_is_silu_of_the_pair_within_rounding(form, stored, monkeypatch):
    from multihead.modules.feedforward import SwiGLU

    N, K = 320, 608  # (down reads N: a multiple of 32)
    mlp = SwiGLU(K, N, bias=False).eval()
    mlp.gate = QuantizedLinear(packed_matrix(form, N, K, stored, seed=1))
    mlp.up = QuantizedLinear(packed_matrix(form, N, K, stored, seed=2))
    mlp.down = QuantizedLinear(packed_matrix(form, K, N, stored, seed=3))
    fused = []
    real = feedforward.silu_pair
    monkeypatch.setattr(feedforward, "silu_pair", lambda *a: fused.append(1) or real(*a))
    x = torch.randn(1, 1, K, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = mlp(x)
        gate, up = linear_pair(mlp.gate, mlp.up, x)  # the pair call's products
        hidden = real(mlp.gate, mlp.up, x)
    assert fused == [1] and got.shape == (1, 1, K)
    torch.testing.assert_close(hidden, F.silu(gate) * up, rtol=1e-6, atol=1e-6)
    g, u = x.double() @ textbook(mlp.gate.packed).t(), x.double() @ textbook(mlp.up.packed).t()
    book = (g * torch.sigmoid(g) * u) @ textbook(mlp.down.packed).t()
    tolerance = 1e-5 * book.abs().max().item()  # (float32 sums of large random products)
    torch.testing.assert_close(got, book.float(), rtol=1e-5, atol=tolerance)
    # a hook on gate (or hooks of the MLP's own), two rows, a gradient: torch's ops
    with torch.no_grad():
        handle = mlp.gate.register_forward_hook(lambda m, i, o: None)
        mlp(x)
        handle.remove()
        mlp(torch.randn(2, K))
    mlp(x.clone().requires_grad_())
    assert fused == [1, 1, 1, 1]  # asked each time, answered only above
    assert real(mlp.gate, mlp.up, torch.randn(2, K)) is None
    assert real(mlp.gate, mlp.up, x.clone().requires_grad_()) is None


def test_append_and_attention_in_one_call_equal_the_two_steps(monkeypatch):
    model, ids = _model(), torch.randint(0, 61, (1, 5))
    fused = []
    real = attention_plain._append_attend_row

    def spy(*args):
        out = real(*args)
        fused.append(out is not None)
        return out

    monkeypatch.setattr(attention_plain, "_append_attend_row", spy)
    with torch.no_grad():
        got = _decode(model, ids)
        assert fused == [True] * 3 * 2  # three one-token steps, two layers: all answered
        monkeypatch.setattr(attention_plain, "_append_attend_row", lambda *a: None)
        expected = _decode(model, ids)
        # the caches hold the same keys and counts either way
        a, b = model.make_caches(1, max_length=9), model.make_caches(1, max_length=9)
        model(ids, caches=a)
        model(ids, caches=b)
        token = got[0].argmax(-1)[:, None]
        monkeypatch.setattr(attention_plain, "_append_attend_row", spy)
        model(token, caches=a)
        monkeypatch.setattr(attention_plain, "_append_attend_row", lambda *a: None)
        model(token, caches=b)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)
    for x, y in zip(a, b, strict=True):
        assert (x.length, x._stored) == (y.length, y._stored) == (6, 6)
        assert torch.equal(x._kv, y._kv)


def test_append_slot_declines_what_append_plain_must_handle():
    from multihead.modules.cache import KVCache

    cache = KVCache(1, 2, 8, max_length=2)
    owner, other = object(), object()
    assert cache.plain_row_slot(owner, 2, 8) is not None
    assert (cache.length, cache._stored) == (1, 1)
    assert cache.plain_row_slot(other, 2, 8) is None  # another module's cache
    assert cache.plain_row_slot(owner, 3, 8) is None  # another layout
    assert cache.plain_row_slot(owner, 2, 8) is not None
    assert cache.plain_row_slot(owner, 2, 8) is None  # full: append_plain raises
    assert (cache.length, cache._stored) == (2, 2)
    assert KVCache(1, 2, 8).plain_row_slot(owner, 2, 8) is None  # no buffer
    assert KVCache(1, 2, 8, max_length=4, window=2).plain_row_slot(owner, 2, 8) is None
    assert KVCache(2, 2, 8, max_length=4).plain_row_slot(owner, 2, 8) is None  # two rows


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 compiler flags")
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")])
def test_small_ops_of_the_avx2_and_scalar_builds(flags, monkeypatch):
    """The same C ops compiled without AVX-512 (libm's exp, scalar loops) and without AVX2."""
    lib = kernels._library(flags)
    assert lib is not None and lib.mh_isa() != 512
    monkeypatch.setattr(kernels, "_library", lambda extra=(): lib)
    # the attention (D a multiple of 16 and not), against SDPA
    for heads, kv_heads, dim, keys in ((9, 3, 64, 128), (6, 2, 40, 37)):
        test_one_query_attention_over_a_cache_is_sdpa_within_rounding(heads, kv_heads, dim, keys)
    # the norm against F.rms_norm; a decoding model's steps against torch's ops
    norm = RMSNorm(77, eps=1e-5)
    x = torch.randn(1, 77) * 3
    with torch.no_grad():
        torch.testing.assert_close(norm(x), F.rms_norm(x, (77,), norm.weight, 1e-5))
        model, ids = _model(), torch.randint(0, 61, (1, 6))
        got = _decode(model, ids)
        monkeypatch.setattr(norm_module, "rms_norm_row", lambda *a: None)
        monkeypatch.setattr(attention_plain, "_append_attend_row", lambda *a: None)
        monkeypatch.setattr(attention_plain, "_attend_one_row", lambda *a: None)
        monkeypatch.setattr(attention_plain, "rope_rows_", lambda *a: False)
        expected = _decode(model, ids)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    # SwiGLU's hidden row: the pair's products, then the SiLU in C
    gate = QuantizedLinear(packed_matrix("int4", 64, 96, "float16", seed=5))
    up = QuantizedLinear(packed_matrix("int4", 64, 96, "float16", seed=6))
    x = torch.randn(1, 96)
    with torch.no_grad():
        g, u = linear_pair(gate, up, x)
        torch.testing.assert_close(feedforward.silu_pair(gate, up, x), F.silu(g) * u)
