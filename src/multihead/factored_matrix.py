"""FactoredMatrix: a matrix M = A @ B kept as its two factors (TransformerLens' class, same names).

A circuit of a head is low rank: the QK circuit W_Q W_K^T (d_model x d_model) has rank at most
d_head, as does the OV circuit W_V W_O. Keeping the factors makes products, norms, singular values
and eigenvalues cost d_head-sized work instead of d_model-sized, and never materialises the
d_model x d_model matrix unless `.AB` asks for it.

Shapes: A (..., ldim, mdim), B (..., mdim, rdim); leading dims broadcast (a model's circuits are
(L, H, d_model, d_model)). M = A @ B is (..., ldim, rdim).

Conventions as TransformerLens' (so code carries over): `svd()` returns (U, S, Vh) with
M = U @ diag(S) @ Vh.T (note the transpose: Vh holds the right singular vectors as columns,
torch.svd's V, not torch.linalg.svd's Vh); `norm()` is the Frobenius norm; `eigenvalues` are
those of M (complex), computed from the small B @ A.

Dtypes: A and B are floating-point (or complex) tensors of one dtype; integer or boolean factors
are a TypeError, not converted: eigenvalues, SVD and norms have no integer form, and a silent
cast would hide which precision the caller meant (pass `A.float()`).
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor


class FactoredMatrix:
    def __init__(self, A: Tensor, B: Tensor) -> None:
        if not isinstance(A, Tensor) or not isinstance(B, Tensor):
            raise TypeError(
                f"A and B must be tensors, got {type(A).__name__} and {type(B).__name__}"
            )
        for name, t in (("A", A), ("B", B)):
            if not (t.is_floating_point() or t.is_complex()):
                raise TypeError(
                    f"{name} must be a floating-point (or complex) tensor, got dtype {t.dtype}: "
                    f"eigenvalues, SVD and norms need one; convert it first ({name}.float())"
                )
        if A.dtype != B.dtype:
            raise TypeError(f"A and B must share a dtype, got {A.dtype} and {B.dtype}")
        if A.dim() < 2 or B.dim() < 2 or A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"A (..., ldim, mdim) and B (..., mdim, rdim) must share mdim, got A "
                f"{tuple(A.shape)} and B {tuple(B.shape)}"
            )
        self.ldim, self.mdim, self.rdim = A.shape[-2], A.shape[-1], B.shape[-1]
        self.has_leading_dims = A.dim() > 2 or B.dim() > 2
        lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        self.shape = torch.Size((*lead, self.ldim, self.rdim))
        self.A = A.broadcast_to(*lead, self.ldim, self.mdim)
        self.B = B.broadcast_to(*lead, self.mdim, self.rdim)

    # -- products -------------------------------------------------------------------------------

    def __matmul__(self, other: Tensor | FactoredMatrix) -> FactoredMatrix | Tensor:
        """M @ other. A vector (rdim,) gives a vector (..., ldim); a matrix keeps the product
        factored, folding `other` into the side that keeps the inner width small."""
        if isinstance(other, FactoredMatrix):
            left = self @ other.A
            assert isinstance(left, FactoredMatrix)
            return left @ other.B
        if not isinstance(other, Tensor):
            return NotImplemented
        if other.dim() < 2:
            self._check(other.shape[-1], self.rdim, "other", other)
            return (self.A @ (self.B @ other.unsqueeze(-1))).squeeze(-1)
        self._check(other.shape[-2], self.rdim, "other", other)
        if self.rdim > self.mdim:
            return FactoredMatrix(self.A, self.B @ other)
        return FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: Tensor) -> FactoredMatrix | Tensor:
        """other @ M."""
        if not isinstance(other, Tensor):
            return NotImplemented
        if other.dim() < 2:
            self._check(other.shape[-1], self.ldim, "other", other)
            return ((other.unsqueeze(-2) @ self.A) @ self.B).squeeze(-2)
        self._check(other.shape[-1], self.ldim, "other", other)
        if self.ldim > self.mdim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.AB)

    def __mul__(self, scalar: float | Tensor) -> FactoredMatrix:
        """A scalar (or a tensor broadcasting over the leading dims: shape (..., 1, 1))."""
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def _check(self, got: int, want: int, name: str, t: Tensor) -> None:
        if got != want:
            raise ValueError(
                f"{name} {tuple(t.shape)} does not fit a factored matrix of shape "
                f"{tuple(self.shape)}"
            )

    # -- dense forms ----------------------------------------------------------------------------

    @property
    def AB(self) -> Tensor:
        """The product A @ B, materialised: (..., ldim, rdim)."""
        return self.A @ self.B

    @property
    def BA(self) -> Tensor:
        """B @ A (..., mdim, mdim): same nonzero eigenvalues as M; needs ldim == rdim."""
        if self.ldim != self.rdim:
            raise ValueError(f"BA needs a square matrix, this one is {tuple(self.shape)}")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    # -- spectra --------------------------------------------------------------------------------

    @cached_property
    def _svd(self) -> tuple[Tensor, Tensor, Tensor]:
        # SVD of each factor, then of the small (mdim x mdim) middle: M = Ua (Sa Va^T Ub Sb) Vb^T
        Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
        middle = Sa[..., :, None] * (Vha @ Ub) * Sb[..., None, :]
        Um, Sm, Vhm = torch.linalg.svd(middle, full_matrices=False)
        U = Ua @ Um  # (..., ldim, k)
        V = (Vhm @ Vhb).transpose(-2, -1)  # (..., rdim, k)
        return U, Sm, V

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """(U, S, Vh) with M = U @ diag(S) @ Vh.T (TransformerLens' convention: Vh is the
        matrix of right singular vectors as columns). k = min(ldim, mdim, rdim) values."""
        return self._svd

    @property
    def U(self) -> Tensor:
        return self._svd[0]

    @property
    def S(self) -> Tensor:
        return self._svd[1]

    @property
    def Vh(self) -> Tensor:
        return self._svd[2]

    @property
    def eigenvalues(self) -> Tensor:
        """Eigenvalues of M (complex, (..., mdim)): those of B @ A, which M shares (M's other
        ldim - mdim eigenvalues are zero)."""
        return torch.linalg.eigvals(self.BA)

    def norm(self) -> Tensor:
        """Frobenius norm (...,), from the singular values."""
        return self.S.pow(2).sum(-1).sqrt()

    # -- shapes ---------------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx) -> FactoredMatrix:
        """Index the leading dims (model.OV[layer, head]); the last two stay whole."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        lead = len(self.shape) - 2
        if sum(i is not Ellipsis and i is not None for i in idx) > lead:
            raise IndexError(
                f"a factored matrix of shape {tuple(self.shape)} indexes its {lead} leading dims "
                "only (take .AB to index the matrix itself)"
            )
        return FactoredMatrix(self.A[idx], self.B[idx])

    def unsqueeze(self, dim: int) -> FactoredMatrix:
        """A new leading dim (dim counts among the leading dims)."""
        if dim < 0:
            dim += self.ndim - 1
        return FactoredMatrix(self.A.unsqueeze(dim), self.B.unsqueeze(dim))

    def get_corner(self, k: int = 3) -> Tensor:
        """The top-left k x k corner of M, without forming M: A[..., :k, :] @ B[..., :, :k]."""
        return self.A[..., :k, :] @ self.B[..., :, :k]

    def collapse_l(self) -> Tensor:
        """(..., mdim, rdim) with the same Gram matrix M^T M as M: diag(S) @ Vh.T. Products
        on the right and Frobenius norms are those of M, at mdim rows."""
        return self.S[..., :, None] * self.Vh.transpose(-2, -1)

    def collapse_r(self) -> Tensor:
        """(..., ldim, mdim) with the same M M^T as M: U @ diag(S)."""
        return self.U * self.S[..., None, :]

    @property
    def pair(self) -> tuple[Tensor, Tensor]:
        return self.A, self.B

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, mdim={self.mdim})"


def composition_scores(left: FactoredMatrix, right: FactoredMatrix) -> Tensor:
    """||left @ right||_F / (||left||_F ||right||_F) over broadcast leading dims: the composition
    score of Elhage et al. (2021), as TransformerLens computes it. Each side is first collapsed
    to its small (mdim-wide) form, which keeps the Frobenius norm of the product."""
    if left.rdim != right.ldim:
        raise ValueError(
            f"left {tuple(left.shape)} and right {tuple(right.shape)} do not chain: "
            f"left's rdim {left.rdim} != right's ldim {right.ldim}"
        )
    product = left.collapse_l() @ right.collapse_r()  # (..., k_left, k_right)
    return product.norm(dim=(-2, -1)) / left.norm() / right.norm()


DEFAULT_MAX_BYTES = 256 * 2**20  # composition products held at once (all_composition_scores)


def all_composition_scores(
    left: FactoredMatrix, right: FactoredMatrix, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> Tensor:
    """(L, H, L, H) composition scores of every earlier head's `left` circuit (L, H, C, C; an
    OV) with every later head's `right` circuit (L, H, C, C: a QK, QK^T or OV), zero unless the
    first layer comes before the second; equal to `composition_scores` on the broadcast pair.

    Bounded memory: each head is collapsed once (its small SVD form, (k, C) / (C, k)), and the
    products are formed for blocks of (source head, target head) pairs whose (n, k_left,
    k_right) products take at most `max_bytes` (default 256 MiB), never for the whole
    (L, H, L, H, k, k) at once; only pairs with the source layer before the target's are
    formed. Beside them live the collapsed circuits (2 L H k C numbers) and the (L, H, L, H)
    result. Shapes: L layers, H heads, C = d_model, k = d_head."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    if len(left.shape) != 4 or left.shape[:2] != right.shape[:2]:
        raise ValueError(
            f"left and right must be (L, H, C, C) circuits of the same heads, got "
            f"{tuple(left.shape)} and {tuple(right.shape)}"
        )
    if left.rdim != right.ldim:
        raise ValueError(
            f"left {tuple(left.shape)} and right {tuple(right.shape)} do not chain: "
            f"left's rdim {left.rdim} != right's ldim {right.ldim}"
        )
    L, H = left.shape[:2]
    lc = left.collapse_l().flatten(0, 1)  # (L, H, kl, C) -> (L*H, kl, C)
    rc = right.collapse_r().flatten(0, 1)  # (L, H, C, kr) -> (L*H, C, kr)
    norms = left.norm().flatten()[:, None] * right.norm().flatten()[None, :]  # (L*H, L*H)
    scores = torch.zeros(L * H, L * H, dtype=lc.dtype, device=lc.device)
    per_pair = lc.shape[-2] * rc.shape[-1] * lc.element_size()  # one (kl, kr) product
    pairs = max(1, max_bytes // per_pair)
    layer = torch.arange(L, device=lc.device).repeat_interleave(H)  # (L*H,) each head's layer
    for i in range(L * H):  # source heads one by one; targets in blocks of `pairs`
        later = torch.nonzero(layer > layer[i]).flatten()
        for start in range(0, len(later), pairs):
            cols = later[start : start + pairs]
            product = lc[i] @ rc[cols]  # (kl, C) @ (n, C, kr) -> (n, kl, kr)
            scores[i, cols] = product.norm(dim=(-2, -1))
    return (scores / norms).view(L, H, L, H)
