"""The tiled backend over q, k, v that are column views of one fused projection (a module's
in_proj output): its autograd.Function takes the projection itself and writes the
projection's gradient in one buffer (tile_packed.py). Gradients against the fp64 textbook
reference and against the same call on separate tensors; which calls take that path: only
calls that say their views are their own (`own_views`, a module's unhooked projections),
never views a caller of attention() made, whose hooks autograd cannot show."""

import pytest
import torch

from helpers_spies import count_calls
from multihead import MultiHeadAttention, attention
from multihead.functional.backends import tiled as tiled_backend
from multihead.functional.call import make_call
from multihead.hooked.hooks import run_with_hooks

from conftest import assert_close
from reference import reference_attention, structure_mask_pairwise

B, T, D = 2, 300, 8
IDS = [[0] * 120 + [1] * 100 + [2] * 80, [0] * 300]
KINDS = {
    "window": ({"window": 64}, {"window": 64}),
    "documents": ({"documents": torch.tensor(IDS)}, {"documents": IDS}),
    "prefix": ({"prefix": 70}, {"prefix": 70}),
    "general plan": ({"window": (40, 0), "prefix": 70}, {"window": (40, 0), "prefix": 70}),
}


@pytest.fixture
def packed_calls(monkeypatch):
    return count_calls(monkeypatch, tiled_backend._TiledPacked, {"apply": "packed"})


def fused(H, Hkv, extra=0, dtype=torch.float64):
    """A (B, T, W) leaf and its q (B, H, T, D), k, v (B, Hkv, T, D) heads-first column views,
    stored in the order q, v, k, then `extra` columns (a multiple of D) nothing reads."""
    W = (H + 2 * Hkv) * D + extra
    x = torch.randn(B, T, W, dtype=dtype, requires_grad=True)
    heads = x.view(B, T, W // D, D).transpose(1, 2)  # (B, W / D, T, D)
    q, v, k, _ = heads.split([H, Hkv, Hkv, extra // D], dim=1)
    return x, q, k, v


def own(q, k, v, **args):
    """The tiled backend on q, k, v declared the caller's own views (as a module does)."""
    call = make_call(q, k, v, causal=True, own_views=True, **args)
    return tiled_backend.tiled_attention(call)[0]


def views_like(x, *views):
    """The same views of another contiguous tensor of x's shape."""
    return tuple(x.as_strided(t.shape, t.stride(), t.storage_offset()) for t in views)


def reference(q, k, v, kind):
    _, args = KINDS[kind]
    ref, _ = reference_attention(
        q, k, v, mask=structure_mask_pairwise(B, T, T, causal=True, **args)
    )
    return ref


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("heads, extra", [((4, 4), 0), ((4, 2), 0), ((4, 2), 2 * D)])
def test_column_views_of_one_tensor_get_its_gradient_in_one_buffer(
    packed_calls, kind, heads, extra
):
    x, q, k, v = fused(*heads, extra=extra)
    call_args, _ = KINDS[kind]
    out = own(q, k, v, **call_args)
    # (the general plan copies strided inputs whole first: no views are left to pack)
    assert packed_calls["packed"] == (kind != "general plan")
    x_ref = x.detach().clone().requires_grad_()
    ref = reference(*views_like(x_ref, q, k, v), kind)
    assert_close(out, ref, torch.float64)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (got,) = torch.autograd.grad((out * g).sum(), x)
    (want,) = torch.autograd.grad((ref * g).sum(), x_ref)
    assert_close(got, want, torch.float64)
    if extra:  # columns no view reads get a zero gradient
        assert torch.equal(got[..., -extra:], torch.zeros_like(got[..., -extra:]))


def test_separate_tensors_and_no_gradient_take_the_plain_function(packed_calls):
    _, q, k, v = fused(4, 2)
    own(q.detach().clone(), k, v, window=64)
    with torch.no_grad():
        own(q, k, v, window=64)
    assert packed_calls["packed"] == 0


def test_overlapping_views_are_not_packed_and_their_gradients_add(packed_calls):
    x = torch.randn(B, T, 4 * D, dtype=torch.float64, requires_grad=True)
    qk = x.view(B, T, 4, D).transpose(1, 2)  # q and k the same view: gradients must add
    out = own(qk, qk, qk, window=64)
    assert packed_calls["packed"] == 0
    (got,) = torch.autograd.grad(out.sum(), x)
    x_ref = x.detach().clone().requires_grad_()
    qk_ref = x_ref.view(B, T, 4, D).transpose(1, 2)
    ref, _ = reference_attention(
        qk_ref, qk_ref, qk_ref, mask=structure_mask_pairwise(B, T, T, causal=True, window=64)
    )
    (want,) = torch.autograd.grad(ref.sum(), x_ref)
    assert_close(got, want, torch.float64)


def test_views_taken_under_no_grad_pass_no_gradient_to_their_base(packed_calls):
    """torch's rule: a view made under no_grad is a leaf of its own (requires_grad, no
    grad_fn); the base gets no gradient through it."""
    x = torch.randn(B, T, 12 * D, dtype=torch.float64, requires_grad=True)
    base = x * 1.0
    with torch.no_grad():
        q, k, v = base.view(B, T, 12, D).transpose(1, 2).split([4, 4, 4], dim=1)
    assert q.requires_grad and q.grad_fn is None
    own(q, k, v, window=64).sum().backward()
    assert packed_calls["packed"] == 0
    assert x.grad is None


def test_views_that_are_observed_keep_their_own_gradients(packed_calls):
    """A retained gradient or a tensor hook on q, k or v: the Function takes the views."""
    _, q, k, v = fused(4, 2)
    q.retain_grad()
    seen = []
    k.register_hook(lambda g: seen.append(g.shape))
    own(q, k, v, window=64).sum().backward()
    assert packed_calls["packed"] == 0
    assert q.grad is not None and q.grad.shape == q.shape
    assert seen == [k.shape]


@pytest.mark.parametrize("kind", ["window", "documents", "prefix"])
def test_a_module_step_takes_the_packed_path_and_matches_the_dense_mask(packed_calls, kind):
    """(T 1024: auto leaves smaller calls to sdpa under the dense mask)"""
    torch.manual_seed(0)
    T = 1024
    m = MultiHeadAttention(32, 4, num_kv_heads=2, causal=True).double()
    x = torch.randn(1, T, 32, dtype=torch.float64, requires_grad=True)
    call_args = {
        "window": {"window": 100},
        "documents": {"documents": torch.arange(T)[None] // 300},
        "prefix": {"prefix": 200},
    }[kind]
    out = m(x, **call_args)
    assert packed_calls["packed"] == 1
    # (the pairwise reference takes document ids as lists)
    args = {name: a.tolist() if torch.is_tensor(a) else a for name, a in call_args.items()}
    dense = structure_mask_pairwise(1, T, T, causal=True, **args)
    ref = m(x, mask=dense, causal=False)
    g = torch.randn(out.shape, dtype=torch.float64)
    params = (x, m.in_proj.weight, m.in_proj.bias)
    got = torch.autograd.grad((out * g).sum(), params)
    want = torch.autograd.grad((ref * g).sum(), params)
    assert_close(out, ref, torch.float64)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, torch.float64)


def test_views_a_caller_made_keep_autograd_and_the_hooks_between(packed_calls):
    """attention() on the caller's views: a tensor hook or retained gradient on a view
    between the projection and q, k, v (which autograd cannot show) still gets its
    gradient; the packed Function is not taken."""
    x = torch.randn(B, T, 12 * D, dtype=torch.float64, requires_grad=True)
    heads = x.view(B, T, 12, D)  # (a view q, k and v are taken of, observed)
    heads.retain_grad()
    seen = []
    heads.register_hook(lambda g: seen.append(1))
    q, k, v = heads.transpose(1, 2).split([4, 4, 4], dim=1)
    out = attention(q, k, v, causal=True, window=64, backend="tiled")
    g = torch.randn(out.shape, dtype=torch.float64)
    out.backward(g)
    assert packed_calls["packed"] == 0 and seen == [1]
    x_ref = x.detach().clone().requires_grad_()
    heads_ref = x_ref.view(B, T, 12, D)
    heads_ref.retain_grad()
    ref = reference(*heads_ref.transpose(1, 2).split([4, 4, 4], dim=1), "window")
    ref.backward(g)
    assert_close(heads.grad, heads_ref.grad, torch.float64)
    assert_close(x.grad, x_ref.grad, torch.float64)


@pytest.mark.parametrize("point", ["hook_q", "hook_k", "hook_v"])
def test_a_hook_shown_q_k_or_v_keeps_its_retained_gradient(packed_calls, point):
    """A hook on hook_q / hook_k / hook_v sees a view of the projection and may retain its
    gradient: the module then does not let the backend write past the views."""
    torch.manual_seed(0)
    T = 1024
    m = MultiHeadAttention(32, 4, causal=True).double()
    x = torch.randn(1, T, 32, dtype=torch.float64)
    shown = {}

    def keep(activation, name):
        activation.retain_grad()
        shown[name] = activation

    run_with_hooks(m, x, fwd_hooks=[(point, keep)], window=100).sum().backward()
    assert packed_calls["packed"] == 0
    got = shown[point].grad
    dense = structure_mask_pairwise(1, T, T, causal=True, window=100)
    run_with_hooks(m, x, fwd_hooks=[(point, keep)], mask=dense, causal=False).sum().backward()
    assert got is not None
    assert_close(got, shown[point].grad, torch.float64)
