"""One NaN rule on every backend: NaN in q, k, v or bias reaches (as NaN) exactly the output rows
torch's math backend gives NaN, whatever `return_weights` says; only a boolean False or a -inf
bias blocks a key; a row with nothing to attend to stays zeros. Checked against
torch.nn.functional.scaled_dot_product_attention under the math backend."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from multihead.functional import attention, scaled_dot_product_attention, varlen_attention

B, H, TQ, TK, D = 2, 3, 5, 7, 8
NAN, INF = float("nan"), float("inf")
# (backend, return_weights): every way a call is run
RUNS = [("eager", False), ("eager", True), ("sdpa", False), ("auto", False), ("auto", True)]


def inputs(kind: str, value: float, *, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, t, D, generator=g) for t in (TQ, TK, TK))
    b = torch.randn(B, H, TQ, TK, generator=g) if bias else None
    if kind == "q":
        q[0, 1, 2, 3] = value
    elif kind == "k":
        k[1, 2, 4, 0] = value
    elif kind == "v":
        v[0, 0, 6, 5] = value
    elif kind == "bias":
        assert b is not None
        b[1, 0, 3, 2] = value
    return q, k, v, b


def math_sdpa(q, k, v, attn_mask=None, is_causal=False):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def ours(q, k, v, backend, weights, **kw):
    out = attention(q, k, v, backend=backend, return_weights=weights, **kw)
    return out[0] if weights else out


def same(a, b):
    assert torch.equal(a.isnan(), b.isnan()), (a.isnan().any(-1), b.isnan().any(-1))
    torch.testing.assert_close(a, b, equal_nan=True, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("backend", "weights"), RUNS)
@pytest.mark.parametrize("kind", ["q", "k", "v", "bias"])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_non_finite_inputs_match_torch_math(backend, weights, kind, value):
    q, k, v, b = inputs(kind, value, bias=True)
    same(ours(q, k, v, backend, weights, bias=b), math_sdpa(q, k, v, attn_mask=b))


@pytest.mark.parametrize(("backend", "weights"), RUNS)
@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_nan_without_mask_or_bias_matches_torch_math(backend, weights, kind):
    """The plain fused path: torch's fused CPU kernel gives 0 for a NaN query; we give NaN."""
    q, k, v, _ = inputs(kind, NAN, bias=False)
    expected = math_sdpa(q, k, v)
    assert expected.isnan().any()
    same(ours(q, k, v, backend, weights), expected)
    bottom_right = torch.ones(TQ, TK, dtype=torch.bool).tril(TK - TQ)  # our causal alignment
    same(ours(q, k, v, backend, weights, causal=True), math_sdpa(q, k, v, attn_mask=bottom_right))


@pytest.mark.parametrize(("backend", "weights"), RUNS)
def test_nan_query_row_is_nan_not_zero(backend, weights):
    """The finding: a NaN query gave zeros on sdpa/auto and NaN on eager."""
    q, k, v, _ = inputs("q", NAN, bias=False)
    out = ours(q, k, v, backend, weights, mask=torch.ones(TQ, TK, dtype=torch.bool))
    assert out[0, 1, 2].isnan().all()
    assert not out[0, 1, [0, 1, 3, 4]].isnan().any()


@pytest.mark.parametrize(("backend", "weights"), RUNS)
def test_nan_bias_is_not_a_blocked_key(backend, weights):
    """The finding: a NaN bias was treated as a blocked key; torch gives NaN on that row."""
    q, k, v, b = inputs("bias", NAN, bias=True)
    out = ours(q, k, v, backend, weights, bias=b)
    assert out[1, 0, 3].isnan().all()
    assert out.isnan().sum() == out.shape[-1]


@pytest.mark.parametrize(("backend", "weights"), RUNS)
@pytest.mark.parametrize("kind", ["q", "k", "bias"])
def test_masked_keys_and_minus_inf_bias_with_nan(backend, weights, kind):
    """A NaN bias on a key the mask blocks is blocked with it; NaN in q or k still reaches the
    rows that meet it in q @ k^T (torch: NaN + -inf is NaN); a row with nothing to attend to is
    zeros; -inf in the bias blocks a key like False."""
    q, k, v, b = inputs(kind, NAN, bias=True)
    mask = torch.ones(B, H, TQ, TK, dtype=torch.bool)
    if kind == "k":
        mask[1, 2, :2, 4] = False  # the NaN key, blocked for queries 0 and 1
    elif kind == "bias":
        mask[1, 0, 3, 2] = False  # the NaN bias entry's key, blocked
    else:
        mask[0, 1, 2, :] = False  # the NaN query's row: nothing to attend to
    b[0, 0, 1, 3] = -INF
    out = ours(q, k, v, backend, weights, mask=mask, bias=b)
    reference = math_sdpa(q, k, v, attn_mask=torch.where(mask, b, -INF))
    nan_rows = out.isnan().any(-1)
    if kind == "k":
        assert nan_rows[1, 2].all() and nan_rows.sum() == TQ  # blocked or not: q @ k^T is NaN
    else:
        assert not nan_rows.any()
    if kind == "q":
        assert (out[0, 1, 2] == 0).all()  # a row with nothing to attend to: zeros, not NaN
        reference[0, 1, 2] = 0.0  # torch's math backend gives NaN (or 0, by version) there
    same(out, reference)


@pytest.mark.parametrize(("backend", "weights"), RUNS)
def test_row_with_nothing_to_attend_is_zeros_even_beside_nan_values(backend, weights):
    q, k, v, _ = inputs("v", NAN, bias=False)
    mask = torch.ones(B, H, TQ, TK, dtype=torch.bool)
    mask[0, 0, 3] = False  # query 3 of (0, 0) sees nothing; key 6 of (0, 0) holds a NaN value
    out = ours(q, k, v, backend, weights, mask=mask)
    assert (out[0, 0, 3] == 0).all()
    assert out[0, 0, [0, 1, 2, 4], 5].isnan().all()  # the rows that read the NaN value
    assert out.isnan().sum() == TQ - 1


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_fully_masked_rows_keep_zero_grads_next_to_nan_free_rows(backend):
    q, k, v, _ = inputs("none", 0.0, bias=False)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = torch.ones(B, H, TQ, TK, dtype=torch.bool)
    mask[:, :, 1] = False
    out = attention(q, k, v, mask=mask, backend=backend)
    out.sum().backward()
    assert (out[:, :, 1] == 0).all()
    assert (q.grad[:, :, 1] == 0).all()
    assert not any(t.grad.isnan().any() for t in (q, k, v))


def test_sdpa_drop_in_follows_math_backend_for_nan_query():
    """torch's default (fused CPU) kernel returns 0 for a NaN query; the drop-in follows the
    math backend (a deliberate difference, listed in the README)."""
    q, k, v, _ = inputs("q", NAN, bias=False)
    fused = F.scaled_dot_product_attention(q, k, v)
    ours_ = scaled_dot_product_attention(q, k, v)
    same(ours_, math_sdpa(q, k, v))
    assert ours_[0, 1, 2].isnan().all()
    assert not fused[0, 1, 2].isnan().any()  # why it is a difference worth listing


@pytest.mark.parametrize("kind", ["q", "k", "v", "bias"])
def test_sdpa_drop_in_matches_math_backend_with_float_mask(kind):
    q, k, v, b = inputs(kind, NAN, bias=True)
    same(scaled_dot_product_attention(q, k, v, attn_mask=b), math_sdpa(q, k, v, attn_mask=b))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto"])
def test_varlen_nan_stays_in_its_row_of_its_sequence(backend):
    lengths = [3, 5, 4]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), H, D, generator=g) for _ in range(3))
    q[4, 1, 2] = NAN  # sequence 1, its second token, head 1
    out = varlen_attention(q, k, v, lengths, backend=backend)
    nan = out.isnan().any(-1)
    assert nan[4, 1] and nan.sum() == 1
    k[9, 0, 0] = NAN  # sequence 2's first key: every query of sequence 2, head 0
    nan = varlen_attention(q, k, v, lengths, backend=backend).isnan().any(-1)
    assert nan[8:, 0].all() and nan[4, 1] and nan.sum() == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_query_over_key_counts_matches_math(dtype):
    """The fused CPU kernel's NaN-query quirk depends on the key count: sweep it, so a torch
    whose threshold moves fails here (sdpa.NAN_QUIRK_KEYS)."""
    g = torch.Generator().manual_seed(2)
    for tk in [*range(1, 40), 64, 65, 130]:
        q = torch.randn(1, 2, 3, 16, generator=g).to(dtype)
        k, v = (torch.randn(1, 2, tk, 16, generator=g).to(dtype) for _ in range(2))
        q[0, 1, 2, 5] = NAN  # the last query: it sees every key, causal or not
        for causal in (False, True):
            out = attention(q, k, v, causal=causal, backend="sdpa")
            nan_rows = out.isnan().any(-1)
            assert nan_rows[0, 1, 2] and nan_rows.sum() == 1, (tk, causal)


@pytest.mark.parametrize("backend", ["sdpa", "auto", "eager"])
@pytest.mark.parametrize(
    ("tq", "tk", "causal", "hkv"),
    [(1, 8, False, 3), (4, 8, False, 3), (8, 8, True, 3), (1, 15, False, 1), (6, 6, True, 1)],
)
def test_nan_in_every_key_a_row_sees_gives_nan_with_few_keys(backend, tq, tk, causal, hkv):
    # torch's unmasked fused CPU kernel returns 0 for a row whose scores are all NaN when
    # there are fewer than 16 keys (the math backend: NaN); the fix once covered NaN queries
    # only. Here every key holds a NaN, in one kv head (GQA: the query heads reading it).
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, tq, D, generator=g)
    k, v = (torch.randn(B, hkv, tk, D, generator=g) for _ in range(2))
    k[1, 0, :, 3] = NAN
    out = attention(q, k, v, causal=causal, backend=backend)
    reads = torch.zeros(B, H, dtype=torch.bool)
    reads[1, : H // hkv] = True  # the query heads of kv head 0, in batch row 1
    assert out.isnan().all(-1).all(-1).eq(reads).all()
    assert not out[~reads].isnan().any()


def test_a_module_whose_keys_are_nan_gives_nan_at_every_length():
    from multihead import MultiHeadAttention

    m = MultiHeadAttention(32, 4).eval()
    with torch.no_grad():
        m.in_proj.bias[32:64] = NAN  # the key projection's rows
    for T in (3, 20):
        assert m(torch.randn(1, T, 32)).isnan().all()
