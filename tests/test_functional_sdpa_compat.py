"""multihead.scaled_dot_product_attention against torch's own, case by case (fp64, CPU).

Every accepted case is compared with `torch.nn.functional.scaled_dot_product_attention` on the same
inputs; every refused case is one that torch refuses too. Sizes are mutually distinct
(L=5, S=7, E=4, Ev=3) so that a swapped axis cannot pass.
"""

import itertools
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from multihead.functional import scaled_dot_product_attention as sdpa

L, S, E, EV = 5, 7, 4, 3


def rand(*shape, requires_grad=False):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=requires_grad)


def same_as_torch(*args, grads=False, **kwargs):
    """Run both on the same inputs; outputs (and input gradients) must agree."""
    ours = sdpa(*args, **kwargs)
    theirs = F.scaled_dot_product_attention(*args, **kwargs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-9)
    if grads:
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        up = torch.randn_like(ours)
        g_ours = torch.autograd.grad(ours, tensors, up)
        g_theirs = torch.autograd.grad(theirs, tensors, up)
        for a, b in zip(g_ours, g_theirs, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
    return ours


# (query, key, value) leading dimensions: equal, broadcast, different ranks, v alone larger.
LEADS = [
    ((), (), ()),
    ((3,), (3,), (3,)),
    ((2, 3), (2, 3), (2, 3)),
    ((1, 3), (2, 1), (2, 1)),
    ((2, 3), (3,), ()),
    ((3,), (2, 3), (2, 3)),
    ((2, 2, 3), (2, 2, 3), (2, 2, 3)),
    ((2, 1, 3), (1, 2, 1), (2, 2, 1)),
    ((1, 1), (1, 1), (2, 3)),
]


@pytest.mark.parametrize("leads", LEADS, ids=str)
@pytest.mark.parametrize("tq,tk", [(L, S), (S, L), (L, L)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_leading_dims_broadcast_like_torch(leads, tq, tk, is_causal):
    lq, lk, lv = leads
    q, k, v = rand(*lq, tq, E), rand(*lk, tk, E), rand(*lv, tk, EV)
    same_as_torch(q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("scale", [0.0, -0.7, 2.0, 3])
@pytest.mark.parametrize("is_causal", [False, True])
def test_zero_negative_and_integer_scale(scale, is_causal):
    q, k, v = rand(2, 3, L, E, requires_grad=True), rand(2, 3, S, E), rand(2, 3, S, EV)
    same_as_torch(q, k, v, is_causal=is_causal, scale=scale, grads=True)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 2, 3)], ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_of_every_broadcastable_shape(lead, kind):
    q, k, v = rand(*lead, L, E), rand(*lead, S, E), rand(*lead, S, EV)
    shapes = [(L, S), (1, S), (L, 1)] + [(*lead[i:], L, S) for i in range(len(lead))]
    if len(lead) < 2:  # torch's 4-D CPU kernel fails on masks of rank < 2 (see test below)
        shapes += [(S,), ()]
    for shape in shapes:
        mask = torch.rand(shape) > 0.4 if kind == "bool" else torch.randn(shape, dtype=q.dtype)
        same_as_torch(q, k, v, attn_mask=mask)


def test_masks_of_rank_below_two_on_4d_inputs():
    """torch 2.13's CPU kernel raises IndexError on them; they broadcast, so they work here."""
    q, k, v = rand(2, 3, L, E), rand(2, 3, S, E), rand(2, 3, S, EV)
    row = torch.rand(S) > 0.3
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=row.expand(L, S))
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=row), expected)
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=torch.tensor(True)), sdpa(q, k, v))


@pytest.mark.parametrize("heads", [(4, 2, 2), (4, 1, 1), (4, 2, 1), (4, 2, 4), (6, 3, 2)], ids=str)
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=str)
@pytest.mark.parametrize("mask_kind", [None, "bool per query head", "float per query head", "2-D"])
def test_gqa_with_masks_and_unequal_kv_heads(heads, lead, mask_kind):
    hq, hk, hv = heads
    q = rand(*lead, hq, L, E, requires_grad=True)
    k, v = rand(*lead, hk, S, E, requires_grad=True), rand(*lead, hv, S, EV)
    mask = {
        None: None,
        "bool per query head": torch.rand(*lead, hq, L, S) > 0.3,
        "float per query head": rand(*lead, hq, L, S),
        "2-D": torch.rand(L, S) > 0.3,
    }[mask_kind]
    same_as_torch(q, k, v, attn_mask=mask, enable_gqa=True, grads=True)


def test_one_key_head_broadcasts_without_enable_gqa():
    q, k, v = rand(2, 4, L, E), rand(2, 1, S, E), rand(2, 1, S, EV)
    same_as_torch(q, k, v)
    same_as_torch(q, rand(2, 1, S, E), rand(2, 4, S, EV))  # value alone has the heads


@pytest.mark.parametrize("tq,tk", [(L, S), (S, L), (L, L)])
@pytest.mark.parametrize("make", [causal_upper_left, causal_lower_right])
def test_causal_bias_variants(tq, tk, make):
    q, k = rand(2, 3, tq, E, requires_grad=True), rand(2, 3, tk, E, requires_grad=True)
    v = rand(2, 3, tk, EV, requires_grad=True)
    with pytest.warns(UserWarning) if make is causal_lower_right and tq > tk else nullcontext():
        bias = make(tq, tk)
    same_as_torch(q, k, v, attn_mask=bias, grads=True)
    # Upper-left is is_causal; lower-right is the bottom-right mask, materialised.
    if make is causal_upper_left:
        torch.testing.assert_close(sdpa(q, k, v, attn_mask=bias), sdpa(q, k, v, is_causal=True))
    else:
        explicit = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
        torch.testing.assert_close(sdpa(q, k, v, attn_mask=bias), sdpa(q, k, v, attn_mask=explicit))


@pytest.mark.parametrize("tq,tk", [(L, S), (S, L)])
def test_is_causal_is_top_left_with_grads(tq, tk):
    q, k = rand(2, 3, tq, E, requires_grad=True), rand(2, 3, tk, E, requires_grad=True)
    v = rand(2, 3, tk, EV, requires_grad=True)
    same_as_torch(q, k, v, is_causal=True, grads=True)
    explicit = torch.ones(tq, tk, dtype=torch.bool).tril()
    torch.testing.assert_close(sdpa(q, k, v, is_causal=True), sdpa(q, k, v, attn_mask=explicit))


def test_bfloat16_query_with_float32_mask():
    q, k, v = (t.bfloat16() for t in (rand(2, 3, L, E), rand(2, 3, S, E), rand(2, 3, S, EV)))
    mask = torch.randn(L, S)
    ours = sdpa(q, k, v, attn_mask=mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=2e-2)


def test_fully_masked_rows_give_zeros_with_finite_gradients():
    q = rand(2, 3, L, E, requires_grad=True)
    k, v = rand(2, 3, S, E, requires_grad=True), rand(2, 3, S, EV, requires_grad=True)
    mask = torch.rand(2, 3, L, S) > 0.5
    mask[0, 1, 2] = False
    mask[1, :, 4] = False
    bias = torch.zeros(L, S, dtype=torch.float64)
    bias[3] = float("-inf")
    for kwargs in (dict(attn_mask=mask), dict(attn_mask=bias)):
        out = same_as_torch(q, k, v, grads=True, **kwargs)
        assert torch.isfinite(out).all()
    assert (sdpa(q, k, v, attn_mask=mask)[0, 1, 2] == 0).all()
    assert (sdpa(q, k, v, attn_mask=bias)[..., 3, :] == 0).all()
    lower_right = sdpa(q, k[:, :, :3], v[:, :, :3], attn_mask=causal_lower_right(L, 3))
    assert (lower_right[:, :, : L - 3] == 0).all() and torch.isfinite(lower_right).all()


def test_dropout_draws_as_torch_and_p_one_gives_zeros():
    q, k, v = rand(2, 3, L, E), rand(2, 3, S, E), rand(2, 3, S, EV)
    for kwargs in (dict(), dict(is_causal=True), dict(attn_mask=torch.rand(L, S) > 0.3)):
        torch.manual_seed(7)
        ours = sdpa(q, k, v, dropout_p=0.4, **kwargs)
        torch.manual_seed(7)
        theirs = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, **kwargs)
        torch.testing.assert_close(ours, theirs)
    q.requires_grad_(True)
    same_as_torch(q, k, v, dropout_p=1.0, grads=True)
    assert (sdpa(q, k, v, dropout_p=1.0) == 0).all()


@pytest.mark.parametrize(
    "shapes",
    [((0, 3, L, E), (0, 3, S, E)), ((2, 0, L, E), (2, 0, S, E)), ((2, 3, 0, E), (2, 3, S, E))],
    ids=str,
)
def test_empty_inputs(shapes):
    qs, ks = shapes
    q, k, v = rand(*qs), rand(*ks), rand(*ks[:-1], EV)
    same_as_torch(q, k, v)


def test_traceable_under_compile_fullgraph():
    q, k, v = rand(2, 3, L, E), rand(2, 1, S, E), rand(2, 1, S, EV)
    mask = torch.rand(2, 3, L, S) > 0.3
    compiled = torch.compile(sdpa, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v, attn_mask=mask), sdpa(q, k, v, attn_mask=mask))


def _q(*shape):
    return rand(*shape)


# (what, args, kwargs, our error, message) -- torch refuses each of these too (checked below).
BAD = [
    (
        "float64 mask, float32 query",
        "f32",
        dict(attn_mask=torch.zeros(L, S, dtype=torch.float64)),
        TypeError,
        "attn_mask must be boolean",
    ),
    (
        "float16 mask, float32 query",
        "f32",
        dict(attn_mask=torch.zeros(L, S, dtype=torch.float16)),
        TypeError,
        "float32 or the query's dtype",
    ),
    (
        "integer mask",
        "f32",
        dict(attn_mask=torch.zeros(L, S, dtype=torch.long)),
        TypeError,
        "attn_mask",
    ),
    (
        "mask and is_causal",
        "f64",
        dict(attn_mask=torch.ones(L, S, dtype=torch.bool), is_causal=True),
        ValueError,
        "is_causal",
    ),
    (
        "CausalBias and is_causal",
        "f64",
        dict(attn_mask=causal_upper_left(L, S), is_causal=True),
        ValueError,
        "CausalBias",
    ),
    (
        "mask of the wrong size",
        "f64",
        dict(attn_mask=torch.ones(L, L, dtype=torch.bool)),
        ValueError,
        r"attn_mask of shape \(5, 5\)",
    ),
    (
        "mask larger than the scores",
        "f64",
        dict(attn_mask=torch.ones(4, 2, 3, L, S, dtype=torch.bool)),
        ValueError,
        "does not broadcast",
    ),
    ("is_causal not a bool", "f64", dict(is_causal=1), TypeError, "is_causal must be a bool"),
    (
        "enable_gqa not a bool",
        "f64",
        dict(enable_gqa="yes"),
        TypeError,
        "enable_gqa must be a bool",
    ),
    ("dropout above 1", "f64", dict(dropout_p=1.5), ValueError, "dropout_p"),
    (
        "mask not a tensor",
        "f64",
        dict(attn_mask=[[True]]),
        TypeError,
        "attn_mask must be a torch.Tensor",
    ),
]


@pytest.mark.parametrize("what,dtype,kwargs,error,match", BAD, ids=[b[0] for b in BAD])
def test_refuses_what_torch_refuses(what, dtype, kwargs, error, match):
    dt = torch.float32 if dtype == "f32" else torch.float64
    q, k, v = (torch.randn(2, 3, t, d, dtype=dt) for t, d in ((L, E), (S, E), (S, EV)))
    with pytest.raises(Exception):  # noqa: B017 - torch's own error types vary
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    with pytest.raises(error, match=match):
        sdpa(q, k, v, **kwargs)


BAD_INPUTS = [
    ("1-D query", (_q(E), _q(S, E), _q(S, EV)), {}, ValueError, "at least 2 dimensions"),
    ("integer query", (torch.ones(L, E, dtype=torch.long),) * 3, {}, TypeError, "floating-point"),
    ("dtypes differ", (_q(L, E), _q(S, E).float(), _q(S, EV)), {}, TypeError, "one dtype"),
    ("head width differs", (_q(L, E), _q(S, E + 1), _q(S, EV)), {}, ValueError, "same last"),
    (
        "key/value lengths differ",
        (_q(L, E), _q(S, E), _q(S + 1, EV)),
        {},
        ValueError,
        "same length",
    ),
    (
        "leading dims clash",
        (_q(2, 3, L, E), _q(2, 2, S, E), _q(2, 2, S, EV)),
        {},
        ValueError,
        "do not broadcast",
    ),
    (
        "gqa heads do not divide",
        (_q(2, 4, L, E), _q(2, 3, S, E), _q(2, 3, S, EV)),
        dict(enable_gqa=True),
        ValueError,
        "must each divide",
    ),
    (
        "gqa on 2-D inputs",
        (_q(L, E), _q(S, E), _q(S, EV)),
        dict(enable_gqa=True),
        ValueError,
        "head axis",
    ),
    (
        "query not a tensor",
        ([[0.0]], _q(S, E), _q(S, EV)),
        {},
        TypeError,
        "query must be a torch.Tensor",
    ),
]


@pytest.mark.parametrize("what,args,kwargs,error,match", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_refuses_bad_inputs_torch_refuses(what, args, kwargs, error, match):
    with pytest.raises(Exception):  # noqa: B017 - torch raises RuntimeError, IndexError, TypeError
        F.scaled_dot_product_attention(*args, **kwargs)
    with pytest.raises(error, match=match):
        sdpa(*args, **kwargs)


def test_scale_must_be_a_finite_number():
    """Deliberate: torch turns nan/inf scales into zeros or NaN output silently, and reads a
    0-d tensor scale's value (a host sync); here they are refused."""
    q, k, v = rand(2, 3, L, E), rand(2, 3, S, E), rand(2, 3, S, EV)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be finite"):
            sdpa(q, k, v, scale=bad)
    with pytest.raises(TypeError, match="scale"):
        sdpa(q, k, v, scale=torch.tensor(0.5))


def test_every_combination_of_flags_on_4d_inputs():
    """A dense sweep: masks x causal x gqa x scale, output and gradients."""
    for mask_kind, causal, gqa, scale in itertools.product(
        [None, "bool", "float"], [False, True], [False, True], [None, -0.5]
    ):
        if mask_kind and causal:
            continue
        q = rand(2, 4, L, E, requires_grad=True)
        k = rand(2, 2 if gqa else 4, S, E, requires_grad=True)
        v = rand(2, 2 if gqa else 4, S, EV, requires_grad=True)
        mask = None
        if mask_kind == "bool":
            mask = torch.rand(2, 1, L, S) > 0.3
        elif mask_kind == "float":
            mask = rand(4, L, S)
        same_as_torch(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa, grads=True
        )


def test_capture_sees_drop_in_calls_with_torchs_mask_meaning():
    """`capture()` without a model records the drop-in's calls; the recorded weights follow the
    boolean mask (True = may attend) and top-left causality, as torch reads them."""
    from multihead.interpret import capture

    q, k, v = rand(2, 3, L, E), rand(2, 3, S, E), rand(2, 3, S, EV)
    mask = torch.rand(L, S) > 0.4
    mask[:, 0] = True
    with capture() as records:
        sdpa(q, k, v, attn_mask=mask)
        sdpa(q, k, v, is_causal=True)
    assert len(records) == 2
    assert (records[0].weights[..., ~mask] == 0).all() and records[0].weights.shape == (2, 3, L, S)
    top_left = torch.ones(L, S, dtype=torch.bool).tril()
    assert (records[1].weights[..., ~top_left[:, : records[1].weights.shape[-1]]] == 0).all()
