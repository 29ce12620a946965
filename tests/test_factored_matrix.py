"""FactoredMatrix against the dense product it stands for (fp64), including broadcast leading
dims, and composition scores against a direct dense formula on a random GPT-2 checkpoint's
weights sliced by hand."""

import pytest
import torch

from multihead.factored_matrix import FactoredMatrix, composition_scores

CLOSE = dict(atol=1e-9, rtol=1e-7)


def factors(*lead_a, lead_b=(), ldim=7, mdim=3, rdim=5):
    A = torch.randn(*lead_a, ldim, mdim, dtype=torch.float64)
    B = torch.randn(*lead_b, mdim, rdim, dtype=torch.float64)
    return A, B


def test_products_transpose_and_shapes_equal_dense():
    A, B = factors(2, 1, lead_b=(4,))  # leading dims (2, 1) and (4,) broadcast to (2, 4)
    M = FactoredMatrix(A, B)
    dense = A @ B
    assert M.shape == (2, 4, 7, 5) and M.ndim == 4 and len(M) == 2
    assert (M.ldim, M.mdim, M.rdim) == (7, 3, 5)
    torch.testing.assert_close(M.AB, dense, **CLOSE)
    torch.testing.assert_close(M.T.AB, dense.transpose(-2, -1), **CLOSE)
    right = torch.randn(5, 6, dtype=torch.float64)
    left = torch.randn(9, 7, dtype=torch.float64)
    vec = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close((M @ right).AB, dense @ right, **CLOSE)
    torch.testing.assert_close((left @ M).AB, left @ dense, **CLOSE)
    torch.testing.assert_close(M @ vec, dense @ vec, **CLOSE)
    torch.testing.assert_close(torch.ones(7, dtype=torch.float64) @ M, dense.sum(-2), **CLOSE)
    other = FactoredMatrix(*factors(ldim=5, mdim=2, rdim=4))
    torch.testing.assert_close((M @ other).AB, dense @ other.AB, **CLOSE)
    torch.testing.assert_close((M * 2.5).AB, 2.5 * dense, **CLOSE)
    torch.testing.assert_close(M[1, 2].AB, dense[1, 2], **CLOSE)
    torch.testing.assert_close(M[:, 3].AB, dense[:, 3], **CLOSE)
    torch.testing.assert_close(M.get_corner(2), dense[..., :2, :2], **CLOSE)
    with pytest.raises(ValueError, match="does not fit"):
        M @ torch.randn(6, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="share mdim"):
        FactoredMatrix(torch.randn(7, 3), torch.randn(4, 5))
    with pytest.raises(IndexError):
        M[0, 0, 0]


@pytest.mark.parametrize("dims", [(7, 3, 5), (4, 6, 5), (6, 2, 6)])
def test_svd_norm_and_collapses_equal_dense(dims):
    ldim, mdim, rdim = dims
    A, B = factors(3, ldim=ldim, mdim=mdim, rdim=rdim)
    M = FactoredMatrix(A, B)
    dense = A @ B
    U, S, Vh = M.svd()
    k = min(dims)
    assert U.shape == (3, ldim, k) and S.shape == (3, k) and Vh.shape == (3, rdim, k)
    # TransformerLens' convention: M = U diag(S) Vh^T
    torch.testing.assert_close(U @ torch.diag_embed(S) @ Vh.transpose(-2, -1), dense, **CLOSE)
    torch.testing.assert_close(S, torch.linalg.svdvals(dense)[..., :k], **CLOSE)
    eye = torch.eye(k, dtype=torch.float64).expand(3, k, k)
    torch.testing.assert_close(U.transpose(-2, -1) @ U, eye, **CLOSE)
    torch.testing.assert_close(M.norm(), torch.linalg.matrix_norm(dense), **CLOSE)
    cl, cr = M.collapse_l(), M.collapse_r()
    torch.testing.assert_close(cl.transpose(-2, -1) @ cl, dense.transpose(-2, -1) @ dense, **CLOSE)
    torch.testing.assert_close(cr @ cr.transpose(-2, -1), dense @ dense.transpose(-2, -1), **CLOSE)


def test_eigenvalues_are_the_dense_nonzero_eigenvalues():
    A, B = factors(2, ldim=6, mdim=3, rdim=6)
    M = FactoredMatrix(A, B)
    ours = M.eigenvalues  # (2, 3): the rank-3 matrix's nonzero eigenvalues
    dense = torch.linalg.eigvals(A @ B)  # (2, 6): those three and three zeros
    for i in range(2):
        top = dense[i][dense[i].abs().argsort(descending=True)[:3]]
        got = ours[i][ours[i].abs().argsort(descending=True)]

        # compare as sets: sort by (real, imag)
        def key(z):
            return sorted(zip(z.real.tolist(), z.imag.tolist(), strict=True))

        for (ar, ai), (br, bi) in zip(key(got), key(top), strict=True):
            assert abs(ar - br) < 1e-8 and abs(ai - bi) < 1e-8
    with pytest.raises(ValueError, match="square"):
        FactoredMatrix(*factors(ldim=6, rdim=5)).eigenvalues  # noqa: B018


def test_composition_score_hand_cases():
    """Orthogonal write/read subspaces compose 0; the same rank-1 map composes 1."""
    e = torch.eye(4, dtype=torch.float64)
    writes_0 = FactoredMatrix(e[:, :1], e[:1, :])  # maps e0 -> e0
    reads_1 = FactoredMatrix(e[:, 1:2], e[1:2, :])  # reads only e1
    reads_0 = FactoredMatrix(e[:, :1], 3 * e[:1, :])
    assert composition_scores(writes_0, reads_1).item() == 0.0
    assert composition_scores(writes_0, reads_0).item() == pytest.approx(1.0)


def test_all_composition_scores_equal_the_dense_formula(tmp_path):
    transformers = pytest.importorskip("transformers")
    from multihead.pretrained import load_causal_lm

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=40, n_embd=24, n_layer=3, n_head=4, n_positions=16)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    model = load_causal_lm(tmp_path)
    C, H, D, L = 24, 4, 6, 3

    def dense(layer, head):  # from HF's Conv1D weights, sliced by hand: x @ W_Q, z @ W_O
        attn = hf.transformer.h[layer].attn
        w = attn.c_attn.weight.double()
        cols = [slice(i * C + head * D, i * C + (head + 1) * D) for i in range(3)]
        wq, wk, wv = (w[:, c] for c in cols)
        wo = attn.c_proj.weight.double()[head * D : (head + 1) * D]
        return wq @ wk.T, wv @ wo  # QK, OV (C, C)

    def score(a, b):
        fro = torch.linalg.matrix_norm
        return (fro(a @ b) / (fro(a) * fro(b))).item()

    with torch.no_grad():
        scores = {m: model.all_composition_scores(m) for m in "QKV"}
        torch.testing.assert_close(model.QK.AB[1, 2].double(), dense(1, 2)[0])
        torch.testing.assert_close(model.OV.AB[2, 0].double(), dense(2, 0)[1])
    for m in "QKV":
        assert scores[m].shape == (L, H, L, H)
    for l1 in range(L):
        for h1 in range(H):
            ov1 = dense(l1, h1)[1]
            for l2 in range(L):
                for h2 in range(H):
                    qk2, ov2 = dense(l2, h2)
                    if l1 >= l2:
                        assert all(scores[m][l1, h1, l2, h2] == 0 for m in "QKV")
                        continue
                    for m, right in (("Q", qk2), ("K", qk2.T), ("V", ov2)):
                        got = scores[m][l1, h1, l2, h2].item()
                        assert got == pytest.approx(score(ov1, right), rel=1e-4)


def test_chunked_composition_scores_equal_the_unchunked_broadcast(tmp_path):
    """The bounded computation (blocks of head pairs, whatever the bound) equals
    `composition_scores` on the whole broadcast (L, H, L, H) pair, the unchunked formula."""
    transformers = pytest.importorskip("transformers")
    from multihead.factored_matrix import all_composition_scores
    from multihead.pretrained import load_causal_lm

    cfg = transformers.GPT2Config(vocab_size=40, n_embd=24, n_layer=3, n_head=4, n_positions=16)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    model = load_causal_lm(tmp_path, dtype=torch.float64)
    with torch.no_grad():
        OV, QK = model.OV, model.QK
        for right in (QK, QK.T, OV):
            whole = composition_scores(
                OV.unsqueeze(2).unsqueeze(3), right.unsqueeze(0).unsqueeze(0)
            )
            earlier = torch.arange(3)[:, None, None, None] < torch.arange(3)[None, None, :, None]
            whole = torch.where(earlier, whole, torch.zeros_like(whole))
            for bound in (1, 6 * 6 * 8 * 5, 2**30):  # one pair at a time, 5 pairs, all at once
                got = all_composition_scores(OV, right, max_bytes=bound)
                torch.testing.assert_close(got, whole, rtol=1e-10, atol=1e-12)
        assert torch.equal(
            model.all_composition_scores("K", max_bytes=300), all_composition_scores(OV, QK.T)
        )
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes must be a positive int"):
            all_composition_scores(OV, QK, max_bytes=bad)
    with pytest.raises(ValueError, match=r"\(L, H, C, C\) circuits"):
        all_composition_scores(OV[0], QK[0])
