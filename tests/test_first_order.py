"""Second derivatives through the tiled backend and the blocked projection, which have none:
a clear error on every path (`.backward()` and `autograd.grad` towards any leaf), never the
silently incomplete result torch's once_differentiable gave `autograd.grad` (only the linear
layers' terms); first derivatives taken with create_graph=True are unchanged."""

import pytest
import torch

from multihead import MultiHeadAttention, attention
from multihead.modules import attention as attention_module

from conftest import assert_close

NO_SECOND = r"has no second derivative"


def qkv(T=1030):
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randn(1, 2, T, 8, dtype=torch.float64, generator=gen, requires_grad=True)
        for _ in range(3)
    ]


@pytest.mark.parametrize("args", [{"window": 64}, {"prefix": 100}, {"window": (9, 0)}])
def test_the_tiled_backend_refuses_a_second_derivative_on_every_path(args):
    q, k, v = qkv()
    out = attention(q, k, v, causal=True, backend="tiled", **args)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match=NO_SECOND):
        torch.autograd.grad(gq.pow(2).sum(), k)
    out = attention(q, k, v, causal=True, backend="tiled", **args)
    (gq,) = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match=NO_SECOND):
        gq.pow(2).sum().backward()


def test_first_derivatives_with_create_graph_are_unchanged():
    q, k, v = qkv()
    out = attention(q, k, v, causal=True, window=64, backend="tiled")
    plain = torch.autograd.grad(out.pow(2).sum(), (q, k, v), retain_graph=True)
    graphed = torch.autograd.grad(out.pow(2).sum(), (q, k, v), create_graph=True)
    for a, b in zip(plain, graphed, strict=True):
        assert_close(b.detach(), a, torch.float64)
    # the eager backend is plain torch: its second derivative runs
    out = attention(q, k, v, causal=True, window=64, backend="eager")
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    (gk,) = torch.autograd.grad(gq.pow(2).sum(), k)
    assert torch.isfinite(gk).all() and gk.abs().sum() > 0


@pytest.mark.parametrize("blocked", [True, False])
def test_a_gradient_penalty_through_a_module_window_is_an_error_not_a_partial_sum(
    monkeypatch, blocked
):
    # (found by a review: autograd.grad of the input's gradient with respect to in_proj's
    # weight returned the linear layers' terms alone through the tiled backend)
    if not blocked:
        monkeypatch.setattr(attention_module, "blocked_projection_serves", lambda *a: False)
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 2, causal=True).double()
    x = torch.randn(1, 1030, 16, dtype=torch.float64, requires_grad=True)
    out = m(x, window=64)
    (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=NO_SECOND):
        torch.autograd.grad(gx.pow(2).sum(), m.in_proj.weight)


def check_ring_refuses_a_second_derivative(rank: int, world: int) -> None:
    from multihead.parallel import ring_attention

    q, k, v = qkv(T=12)
    out = ring_attention(q, k, v, causal=True, window=5)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match=NO_SECOND):
        torch.autograd.grad(gq.pow(2).sum(), k)


def test_ring_attention_refuses_a_second_derivative():
    from helpers_parallel import run_world

    run_world(check_ring_refuses_a_second_derivative, 1)
