"""The drop-in against torch.nn.MultiheadAttention with copied weights: outputs, weights, grads."""

import itertools

import pytest
import torch
from torch import nn

from multihead.compat import MultiheadAttention

E, H, L, S, B = 12, 3, 5, 7, 2  # mutually distinct


def pair(dtype=torch.float64, **cfg):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, dtype=dtype, **cfg)
    with torch.no_grad():  # torch zero-inits biases; make them matter
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = MultiheadAttention(E, H, dtype=dtype, **cfg)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def inputs(kind, batch_first, kdim=E, vdim=E, dtype=torch.float64, batched=True):
    def t(n, width):
        if not batched:
            return torch.randn(n, width, dtype=dtype)
        return (
            torch.randn(B, n, width, dtype=dtype)
            if batch_first
            else torch.randn(n, B, width, dtype=dtype)
        )

    q = t(L, E)
    if kind == "self":
        return q, q, q
    if kind == "cross_same":
        k = t(S, kdim)
        return q, k, k if kdim == vdim else t(S, vdim)
    return q, t(S, kdim), t(S, vdim)


def make_masks(kind_kp, kind_attn, tq, tk, batched=True, dtype=torch.float64):
    kp = attn = None
    if kind_kp != "none":
        blocked = torch.rand(B if batched else 1, tk) > 0.6
        blocked[:, 0] = False  # keep a key for every row: torch gives NaN otherwise
        blocked = blocked if batched else blocked[0]
        kp = (
            blocked
            if kind_kp == "bool"
            else torch.zeros(blocked.shape, dtype=dtype).masked_fill(blocked, -1e4)
        )
    if kind_attn != "none":
        shape = (tq, tk) if kind_attn.endswith("2d") else ((B if batched else 1) * H, tq, tk)
        blocked = torch.rand(shape) > 0.6
        blocked[..., 0] = False
        if kind_attn.startswith("bool"):
            attn = blocked
        else:
            attn = torch.randn(shape, dtype=dtype).masked_fill(blocked, float("-inf"))
    return kp, attn


def compare(ref, ours, args, kwargs, atol=1e-10, rtol=1e-8, grads=True):
    out_r, w_r = ref(*args, **kwargs)
    out_o, w_o = ours(*args, **kwargs)
    torch.testing.assert_close(out_o, out_r, atol=atol, rtol=rtol)
    if w_r is None:
        assert w_o is None
    else:
        torch.testing.assert_close(w_o, w_r, atol=atol, rtol=rtol)
    if grads and out_r.requires_grad:
        g = torch.randn_like(out_r)
        gr = torch.autograd.grad(out_r, list(ref.parameters()), g, allow_unused=True)
        go = torch.autograd.grad(out_o, list(ours.parameters()), g, allow_unused=True)
        for a, b in zip(go, gr, strict=True):
            if b is None:
                assert a is None or torch.all(a == 0)
            else:
                torch.testing.assert_close(a, b, atol=atol * 10, rtol=rtol * 10)


CONFIGS = [
    dict(),
    dict(bias=False),
    dict(add_bias_kv=True),
    dict(add_zero_attn=True),
    dict(add_bias_kv=True, add_zero_attn=True),
    dict(kdim=8, vdim=10),
]


# Self-attention needs kdim == vdim == embed_dim, so those pairs are left out.
CASES = [
    (c, k)
    for c in CONFIGS
    for k in ("self", "cross_same", "cross")
    if not (k == "self" and "kdim" in c)
]


@pytest.mark.parametrize("cfg,kind", CASES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_configurations(cfg, kind, batch_first, need_weights, average):
    ref, ours = pair(batch_first=batch_first, **cfg)
    args = inputs(kind, batch_first, cfg.get("kdim", E), cfg.get("vdim", E))
    compare(ref, ours, args, dict(need_weights=need_weights, average_attn_weights=average))


@pytest.mark.parametrize(
    "kp,attn",
    [
        p
        for p in itertools.product(
            ["none", "bool", "float"], ["none", "bool2d", "float2d", "bool3d", "float3d"]
        )
        if p != ("none", "none")
    ],
)
@pytest.mark.parametrize("cfg", [dict(), dict(add_bias_kv=True, add_zero_attn=True)])
@pytest.mark.parametrize("need_weights", [True, False])
def test_masks(kp, attn, cfg, need_weights):
    ref, ours = pair(batch_first=True, **cfg)
    q, k, v = inputs("cross", True)
    kpm, am = make_masks(kp, attn, L, S)
    with (
        pytest.warns(UserWarning)
        if (kp != "none" and attn != "none" and kp[:4] != attn[:4])
        else _nothing()
    ):
        compare(
            ref,
            ours,
            (q, k, v),
            dict(key_padding_mask=kpm, attn_mask=am, need_weights=need_weights),
        )


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("with_kp", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_is_causal_with_causal_mask(need_weights, with_kp, batch_first):
    ref, ours = pair(batch_first=batch_first)
    x = inputs("self", batch_first)[0]
    causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    kpm = make_masks("bool", "none", L, L)[0] if with_kp else None
    compare(
        ref,
        ours,
        (x, x, x),
        dict(attn_mask=causal, is_causal=True, key_padding_mask=kpm, need_weights=need_weights),
    )


@pytest.mark.parametrize("attn", ["none", "bool2d", "float3d"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_unbatched(attn, need_weights):
    ref, ours = pair(add_bias_kv=True)
    q, k, v = inputs("cross", False, batched=False)
    kpm, am = make_masks("bool", attn, L, S, batched=False)
    compare(
        ref, ours, (q, k, v), dict(key_padding_mask=kpm, attn_mask=am, need_weights=need_weights)
    )


@pytest.mark.parametrize("batch_first", [True, False])
def test_eval_no_grad_matches_torch_fast_path(batch_first):
    # With no_grad, eval and batch_first, torch runs its native fused kernel.
    ref, ours = pair(dtype=torch.float32, batch_first=batch_first, dropout=0.3)
    ref.eval(), ours.eval()
    x = inputs("self", batch_first, dtype=torch.float32)[0]
    kpm = make_masks("bool", "none", L, L)[0]
    with torch.no_grad():
        for kw in (
            dict(need_weights=False),
            dict(need_weights=False, key_padding_mask=kpm),
            dict(),
        ):
            compare(ref, ours, (x, x, x), kw, atol=1e-5, rtol=1e-4)


def test_float32_and_bfloat16():
    for dtype, tol in (
        (torch.float32, dict(atol=1e-5, rtol=1e-4)),
        (torch.bfloat16, dict(atol=3e-2, rtol=3e-2)),
    ):
        ref, ours = pair(dtype=dtype, batch_first=True, add_bias_kv=True)
        args = inputs("cross", True, dtype=dtype)
        kpm, am = make_masks("bool", "float2d", L, S, dtype=dtype)
        for need_weights in (True, False):
            out_r, _ = ref(
                *args, key_padding_mask=kpm, attn_mask=am.to(dtype), need_weights=need_weights
            )
            out_o, _ = ours(
                *args, key_padding_mask=kpm, attn_mask=am.to(dtype), need_weights=need_weights
            )
            assert out_o.dtype == dtype
            torch.testing.assert_close(out_o.float(), out_r.float(), **tol)


def test_dropout_train_with_weights_matches_torch_under_the_same_seed():
    ref, ours = pair(batch_first=True, dropout=0.4)
    x = inputs("self", True)[0]
    torch.manual_seed(7)
    out_r, w_r = ref(x, x, x)
    torch.manual_seed(7)
    out_o, w_o = ours(x, x, x)
    torch.testing.assert_close(out_o, out_r)
    torch.testing.assert_close(w_o, w_r)


def test_dropout_train_fused_path_matches_torch_under_the_same_seed():
    ref, ours = pair(batch_first=True, dropout=0.4)
    x = inputs("self", True)[0]
    torch.manual_seed(7)
    out_r, _ = ref(x, x, x, need_weights=False)
    torch.manual_seed(7)
    out_o, _ = ours(x, x, x, need_weights=False)
    torch.testing.assert_close(out_o, out_r)
    ours.eval()
    assert torch.equal(ours(x, x, x)[0], ours(x, x, x)[0])


def test_fully_masked_rows_give_zeros_where_torch_gives_nan():
    ref, ours = pair(batch_first=True)
    q, k, v = inputs("cross", True)
    am = torch.zeros(L, S, dtype=torch.bool)
    am[2] = True  # query 2 may attend to nothing
    out_r, w_r = ref(q, k, v, attn_mask=am)
    out_o, w_o = ours(q, k, v, attn_mask=am)
    assert torch.isnan(w_r[:, 2]).all()
    assert (w_o[:, 2] == 0).all() and torch.isfinite(out_o).all()
    # The attention output of that row is zero, so the module returns the output bias there.
    torch.testing.assert_close(out_o[:, 2], ours.out_proj.bias.expand(B, E))
    keep = [i for i in range(L) if i != 2]
    torch.testing.assert_close(out_o[:, keep], out_r[:, keep])
    out_o.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters())
