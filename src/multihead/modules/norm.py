"""Normalisation layers: LayerNorm and RMSNorm (Zhang & Sennrich 2019) with TransformerLens'
hook points, and their scale-only forms (`LayerNormPre`, `RMSNormPre`) that weight folding
leaves behind (see `multihead.modules.folding`).

Hook points (as TransformerLens'): hook_scale (..., 1), the divisor of the centred (LayerNorm)
or raw (RMSNorm) input, sqrt(mean(x^2) + eps); hook_normalized (..., C), the norm's output
(after its weight and bias). With no hooks the forward is the plain one (F.layer_norm). Hooks
on hook_scale see the scale computed beside the model's own computation, which stays exactly as
it is unless a hook returns a replacement (freezing a norm): then the output is the explicit
formula, divided by the replacement.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hook_points import ModuleHooks, hooks_for
from .quantized.kernels import rms_norm_row

NORM_HOOK_POINTS = ("hook_scale", "hook_normalized")


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm (same parameters and state_dict keys) with hook_scale and
    hook_normalized."""

    hook_points = NORM_HOOK_POINTS

    def forward(self, x: Tensor) -> Tensor:
        hooks = hooks_for(self)
        if hooks is None:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return _hooked(self, x, hooks, centre=True)

    def plain(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and cast back.

    `offset`: the gain is `offset + weight` (Gemma stores w and scales by 1 + w, in fp32
    before the cast back, as transformers' GemmaRMSNorm); 0 is the plain norm."""

    hook_points = NORM_HOOK_POINTS

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        device=None,
        dtype=None,
        *,
        elementwise_affine=True,
        offset: float = 0.0,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.offset = float(offset)
        self.normalized_shape = (dim,)
        self.weight: nn.Parameter | None = None
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = None  # RMSNorm has none; named so the folding code reads both norms alike

    def forward(self, x: Tensor) -> Tensor:
        hooks = hooks_for(self)
        if hooks is not None:
            return _hooked(self, x, hooks, centre=False)
        return self.plain(x)

    def plain(self, x: Tensor) -> Tensor:
        w = self.weight
        if (
            x.dtype == torch.float32
            and x.is_cpu
            and not self.offset
            and (w is None or w.dtype == x.dtype)
        ):
            if x.shape[-1] != self.normalized_shape[0]:  # (F.rms_norm names the shapes)
                return F.rms_norm(x, self.normalized_shape, w, self.eps)
            if x.numel() == x.shape[-1] and _row_kernel_reads(x, w):
                # a decoding step's one row: one C call (kernels.rms_norm_row) instead of the
                # seven ops below, values within float32 rounding of them
                y = rms_norm_row(x, w, self.eps)
                if y is not None:
                    return y
            # F.rms_norm's values (bit for bit on CPU in float32: the same ops in the same
            # order, tests/test_decode_step_costs.py) in fewer dispatches: torch's op is a
            # composite of eight (pow, sum, div, add, rsqrt, mul, type_as, mul), which cost a
            # decode step of SmolLM2 (61 norms) 2.2 ms more (32.2 -> 29.9 ms, one thread)
            if torch.compiler.is_compiling():
                h = torch.mean(x * x, -1, keepdim=True).add_(self.eps).rsqrt_()  # (..., 1)
            else:
                # the same ops (torch.mean on CPU is a sum, then a division by the count), with
                # the count and eps as float32 tensors made once: a Python number is wrapped
                # into a tensor and copied on each call (~1.4 us each, 122 per SmolLM2 step)
                count, eps = self._constants(x.shape[-1])
                h = torch.sum(x * x, -1, keepdim=True).div_(count).add_(eps).rsqrt_()
            return torch.mul(x, h) if w is None else torch.mul(x, h).mul_(w)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            assert self.weight is not None
            return (h * (self.weight.float() + self.offset)).to(x.dtype)
        return h.to(x.dtype) if self.weight is None else h.to(x.dtype) * self.weight

    def _constants(self, count: int) -> tuple[Tensor, Tensor]:
        """The count and eps as 0-dim float32 CPU tensors, remade when eps changes."""
        kept = self.__dict__.get("_kept_constants")
        if kept is None or kept[0] != (count, self.eps):
            # (normal tensors even when first made under inference_mode: a later call that
            # records a gradient saves them for backward)
            with torch.inference_mode(False):
                values = (torch.tensor(float(count)), torch.tensor(self.eps, dtype=torch.float32))
            kept = self.__dict__["_kept_constants"] = ((count, self.eps), values)
        return kept[1]

    def gain(self) -> Tensor | None:
        """The effective weight the normalised input is multiplied by (offset + weight)."""
        if self.weight is None or not self.offset:
            return self.weight
        return self.weight + self.offset

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, eps={self.eps}" + (
            f", offset={self.offset}" if self.offset else ""
        )


class LayerNormPre(LayerNorm):
    """LayerNorm without weight or bias (TransformerLens' LNPre): what folding leaves."""

    def __init__(self, dim: int, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__(dim, eps=eps, elementwise_affine=False, device=device, dtype=dtype)


class RMSNormPre(RMSNorm):
    """RMSNorm without weight (TransformerLens' RMSNormPre): what folding leaves."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__(dim, eps, device, dtype, elementwise_affine=False)


def _row_kernel_reads(x: Tensor, w: Tensor | None) -> bool:
    """Whether `rms_norm_row` may take x (float32 on the CPU: the caller checked) and w: both
    contiguous, no gradient to record."""
    grad = torch.is_grad_enabled()
    return (
        x.is_contiguous()
        and not (grad and x.requires_grad)
        and (w is None or (w.is_cpu and w.is_contiguous() and not (grad and w.requires_grad)))
    )


def _hooked(norm: LayerNorm | RMSNorm, x: Tensor, hooks: ModuleHooks, *, centre: bool) -> Tensor:
    """The norm with its hook points served. x (..., C); scale (..., 1)."""
    out = None
    if "hook_scale" in hooks:
        h = x.float()
        if centre:
            h = h - h.mean(-1, keepdim=True)
        shown = (h.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt().to(x.dtype)  # (..., 1)
        scale = hooks("hook_scale", shown)
        if scale is not shown:  # a hook replaced the scale (froze the norm): divide by it
            out = (h / scale.float()).to(x.dtype)
            gain = norm.gain() if isinstance(norm, RMSNorm) else norm.weight
            if gain is not None:
                out = out * gain
            if norm.bias is not None:
                out = out + norm.bias
    if out is None:  # nothing replaced: the model's own computation, exactly
        out = norm.plain(x)
    return hooks("hook_normalized", out)


def make_norm(
    kind: str, dim: int, eps: float, offset: float = 0.0, **factory
) -> LayerNorm | RMSNorm:
    """`offset` (RMSNorm only): the gain is offset + weight (Gemma's 1 + w)."""
    if kind == "layernorm":
        if offset:
            raise ValueError(f"a weight offset ({offset}) applies to rmsnorm, not layernorm")
        return LayerNorm(dim, eps=eps, **factory)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps, offset=offset, **factory)
    raise ValueError(f"unknown norm {kind!r}; choose 'layernorm' or 'rmsnorm'")
