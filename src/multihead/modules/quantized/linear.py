"""A packed weight matrix behind nn.Linear's interface, and behind nn.Embedding's.

`QuantizedLinear(x)` multiplies by the weight as stored (kernels.py); `.weight` is the
dequantised (out, in) matrix, computed on each access (no gradient, nothing cached), so weight
views (W_Q ... W_U), folding and analysis code read an ordinary tensor. Blocks call these modules
as they call nn.Linear (through `__call__`, so module hooks fire).

Forms (`form`):
- "int4": buffers qs (N, K/2) uint8, scale and zero (N, K/32), w = q scale + zero: float16
  where the file's own values are float16 (Q4_1's d and m: exact), float32 where they are
  products (Q4_K's d sc and -dmin mn); zero None stands for -8 scale (Q4_0: nothing stored);
- "int8": qs (N, K) int8, scale (N, K/32) float16 or float32 (Q8_0: float16, the file's d);
- "blocks": qs (N, row bytes) uint8, the file's own blocks, with a `dequantize(rows) -> float32
  (n, K)` function given by the loader (every other type): the product dequantises a tile of
  rows at a time.
Activations keep their dtype (float32 unless the model was loaded in another); the products
compute in float32 and cast back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from .kernels import (
    SCALE_DTYPES,
    Buffers,
    KernelArgs,
    _kernel_reads,
    _plan,
    _tiled,
    dense_mm,
    dense_reads,
    dequantize_int4,
    dequantize_int8,
    int4_mm,
    int8_mm,
    packed_mm,
    packed_mm_pair,
    packed_take,
    run_kernel,
    run_pair,
    run_pair_silu,
    tiled_transposed,
)

RowDequantizer = Callable[[Tensor], Tensor]  # (n, row bytes) uint8 -> (n, K) float32
FORMS = ("int4", "int8", "blocks")


class PackedRows(nn.Module):
    """The packed matrix itself (buffers), shared by a tied embedding and LM head."""

    qs: Tensor
    scale: Tensor | None
    zero: Tensor | None
    like: Tensor

    def __init__(
        self,
        form: str,
        shape: tuple[int, int],
        qs: Tensor,
        scale: Tensor | None = None,
        zero: Tensor | None = None,
        *,
        dequantize: RowDequantizer | None = None,
        qtype: str = "",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        if form == "blocks" and dequantize is None:
            raise ValueError("form 'blocks' needs a dequantize function")
        if form != "blocks" and (scale is None or scale.dtype not in SCALE_DTYPES):
            raise ValueError(f"form {form!r} needs a float16 or float32 scale")
        if zero is not None and (form != "int4" or scale is None or zero.dtype != scale.dtype):
            raise ValueError("zero is for form 'int4' only, in the scale's dtype")
        self.form, self.shape, self.qtype = form, tuple(shape), qtype
        self._dequantize = dequantize
        self.register_buffer("qs", qs)
        self.register_buffer("scale", scale)
        self.register_buffer("zero", zero)
        # no values: carries the compute dtype and the device for code that asks a weight
        self.register_buffer("like", torch.empty(0, dtype=dtype, device=qs.device), False)

    @property
    def dtype(self) -> torch.dtype:
        return self.like.dtype

    def rows(self, start: int, stop: int) -> Tensor:
        """Rows start..stop dequantised, in the compute dtype."""
        if self.form == "int4":
            assert self.scale is not None
            zero = None if self.zero is None else self.zero[start:stop]
            return dequantize_int4(self.qs[start:stop], self.scale[start:stop], zero, self.dtype)
        if self.form == "int8":
            assert self.scale is not None
            return dequantize_int8(self.qs[start:stop], self.scale[start:stop], self.dtype)
        return self.take(torch.arange(start, stop, device=self.qs.device))

    def take(self, index: Tensor) -> Tensor:
        """The rows `index` (any shape) dequantised: (*index.shape, K)."""
        flat = index.reshape(-1)
        if self.form != "blocks" and torch.compiler.is_compiling():
            w = packed_take(self.qs, self.scale, self.zero, flat, self.form, self.shape[1])
            w = w.to(self.dtype)
        elif self.form == "int4":
            assert self.scale is not None
            zero = None if self.zero is None else self.zero[flat]
            w = dequantize_int4(self.qs[flat], self.scale[flat], zero, self.dtype)
        elif self.form == "int8":
            assert self.scale is not None
            w = dequantize_int8(self.qs[flat], self.scale[flat], self.dtype)
        else:
            assert self._dequantize is not None
            w = self._dequantize(self.qs[flat].cpu()).to(self.qs.device, self.dtype)
        return w.view(*index.shape, self.shape[1])

    def matmul(self, x: Tensor) -> Tensor:
        """x (M, K) in the compute dtype -> (M, N); differentiable in x (the weight is not a
        parameter: it has no gradient)."""
        if x.dim() != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"expected x of shape (M, {self.shape[1]}), got {tuple(x.shape)}")
        if x.requires_grad and torch.is_grad_enabled():
            return _PackedMatmul.apply(x, self)
        return self._matmul(x)

    def one_row(self, x: Tensor) -> Tensor | None:
        """x (..., K) holding ONE row of float32 activations on the CPU, needing no gradient ->
        (..., N) by the compiled kernel, the per-call work cut to the C call and its output (a
        decoding step makes ~120 of these per token: each Python layer costs ~1-3 us, a tenth
        of a 576 x 576 product). Each row's value is `_matmul`'s. None where another path must
        run: under torch.compile (the `packed_mm` operator), with a gradient, the "blocks"
        form, more than one row, no compiler."""
        if (
            torch.compiler.is_compiling()
            or x.dtype is not torch.float32
            or not x.is_cpu
            or (x.requires_grad and torch.is_grad_enabled())
            or x.numel() != self.shape[1]
        ):
            return None
        args = self._row_args()
        if args is None:
            return None
        fn, qs, scale, zero, half, N, K, parallel = args
        y = torch.empty((*x.shape[:-1], N), dtype=torch.float32)  # (the C code writes float32)
        threads = torch.get_num_threads() if parallel else 1
        fn(x.contiguous().data_ptr(), qs, scale, zero, half, y.data_ptr(), 1, N, K, threads)
        return y

    def _row_args(self) -> KernelArgs | None:
        """`_kernel_args`, kept on the module while its buffers are the same tensors at the same
        addresses with the same scale dtype (`.to()` and `load_state_dict(assign=True)` put new
        tensors, `share_memory_` moves one's storage): checking that costs a few reads, against
        ~1.5 us for `_kernel_args`' keyed lookup. Kept by identity, not reference (a reference
        would keep a moved model's old buffers alive); dropped from pickles and copies
        (`__getstate__`: it holds addresses and a C function)."""
        b = self._buffers
        qs, scale, zero = b["qs"], b["scale"], b["zero"]
        if qs is None or scale is None or self.form == "blocks":
            return None
        key = (id(qs), id(scale), id(zero), qs.data_ptr(), scale.data_ptr(), scale.dtype)
        hit = self.__dict__.get("_row_plan")
        if hit is None or hit[0] != key or (zero is not None and hit[1] != zero.data_ptr()):
            zp = None if zero is None else zero.data_ptr()
            hit = (key, zp, self._kernel_args())
            self.__dict__["_row_plan"] = hit
        return hit[2]

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_row_plan", None)
        return state

    def _kernel_buffers(self) -> Buffers:
        """(qs, scale, zero): the buffers the kernel reads (zero None where there is none)."""
        b = self._buffers
        qs, scale, zero = b["qs"], b["scale"], b["zero"]
        assert qs is not None and scale is not None
        return qs, scale, zero

    def _kernel_args(self) -> KernelArgs | None:
        """The kernel's constants for these buffers (`kernels._plan`: kept beside the qs tensor,
        not on the module, so the module still pickles and deep-copies; remade when a buffer
        moved: `.to()`, `load_state_dict`)."""
        return _plan(self.form, *self._kernel_buffers())

    def _matmul(self, x: Tensor) -> Tensor:
        if self.form != "blocks" and x.device.type == "cpu" and torch.compiler.is_compiling():
            return packed_mm(x.float(), self.qs, self.scale, self.zero, self.form).to(x.dtype)
        if self.form != "blocks" and x.dtype is torch.float32 and x.device.type == "cpu":
            args = self._kernel_args()
            if args is not None:
                if _kernel_reads(x):
                    return run_kernel(x.contiguous(), args)
                if dense_reads(x, args):  # a prefill: dequantise into one buffer, one GEMM
                    return dense_mm(x, self.form == "int4", args)
        if x.device.type != "cpu" or self.form == "blocks":
            # CUDA (and the file's own blocks): dequantise a tile of rows, multiply, repeat
            return _tiled(x, self.shape[0], self.rows)
        x32 = x.float()
        if self.form == "int4":
            assert self.scale is not None
            y = int4_mm(x32, self.qs, self.scale, self.zero)
        else:
            assert self.scale is not None
            y = int8_mm(x32, self.qs, self.scale)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.qtype or self.form}, shape={self.shape}"


class _PackedMatmul(torch.autograd.Function):
    """The packed product with the input's gradient, g @ W, read a tile of rows at a time."""

    @staticmethod
    def forward(ctx, x: Tensor, packed: PackedRows) -> Tensor:
        ctx.packed = packed
        return packed._matmul(x)

    @staticmethod
    def backward(ctx, g: Tensor):
        packed = ctx.packed
        N, K = packed.shape
        return tiled_transposed(g.contiguous(), N, K, packed.rows).to(g.dtype), None


class QuantizedLinear(nn.Module):
    """`y = x W^T + b` with W packed. in_features, out_features and bias as nn.Linear's."""

    def __init__(self, packed: PackedRows, bias: Tensor | None = None) -> None:
        super().__init__()
        self.packed = packed
        self.out_features, self.in_features = packed.shape
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def weight(self) -> Tensor:
        """The dequantised (out, in) matrix, made on each access (not a parameter)."""
        return self.packed.rows(0, self.out_features)

    @property
    def weight_like(self) -> Tensor:
        """An empty tensor of the compute dtype and device (what callers ask a weight for)."""
        like = self.packed.like
        assert isinstance(like, Tensor)
        return like

    def forward(self, x: Tensor) -> Tensor:
        packed: PackedRows = self._modules["packed"]  # type: ignore[assignment]
        shape = x.shape
        if shape[-1] != self.in_features:  # (the kernel reads K values per row)
            raise ValueError(
                f"QuantizedLinear expects input (..., {self.in_features}), got {tuple(shape)}"
            )
        y = packed.one_row(x)  # a decoding step's row (None: the general path below)
        if y is not None:
            return y if self.bias is None else y + self.bias
        # (..., K) -> (M, K) -> (M, N) -> (..., N)
        y = packed.matmul(x.reshape(-1, shape[-1]) if len(shape) != 2 else x)
        if len(shape) != 2:
            y = y.view((*shape[:-1], self.out_features))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class QuantizedEmbedding(nn.Module):
    """A lookup table whose rows are dequantised as they are looked up."""

    def __init__(self, packed: PackedRows) -> None:
        super().__init__()
        self.packed = packed
        self.num_embeddings, self.embedding_dim = packed.shape
        self.padding_idx = None

    @property
    def weight(self) -> Tensor:
        """The dequantised (vocabulary, width) table, made on each access."""
        return self.packed.rows(0, self.num_embeddings)

    @property
    def weight_like(self) -> Tensor:
        like = self.packed.like
        assert isinstance(like, Tensor)
        return like

    def forward(self, ids: Tensor) -> Tensor:
        if ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"embedding ids must be int32 or int64, got {ids.dtype}")
        # out-of-range ids: the same IndexError an nn.Embedding raises
        F.embedding(ids, torch.empty(self.num_embeddings, 0, device=ids.device))
        return self.packed.take(ids)  # (...) -> (..., C)


def linear_pair(first: nn.Module, second: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """`(first(x), second(x))` for two projections of one input (SwiGLU's gate and up). When
    both are packed in one form, without bias, hooks or a replaced forward, and x is one row
    of float32 activations (a decoding step) that needs no gradient, both products are one
    kernel call (values as the two calls give them); otherwise the two modules are called."""
    if (
        type(first) is QuantizedLinear
        and type(second) is QuantizedLinear
        and x.dtype is torch.float32
        and x.is_cpu
        and not (x.requires_grad and torch.is_grad_enabled())
        and first.bias is None
        and second.bias is None
        and _no_hooks(first)
        and _no_hooks(second)
    ):
        a: PackedRows = first._modules["packed"]  # type: ignore[assignment]
        b: PackedRows = second._modules["packed"]  # type: ignore[assignment]
        shape = x.shape
        if (
            a.form == b.form
            and a.form != "blocks"
            and shape[-1] == a.shape[1] == b.shape[1]
            and x.numel() == shape[-1]  # one row
        ):
            # (..., K) -> (1, K) -> (1, NA + NB) -> two (..., N)
            y = _pair_matmul(a, b, x.reshape(1, shape[-1]))
            if y is not None:
                u, v = y.split((a.shape[0], b.shape[0]), dim=1)
                return u.view(*shape[:-1], a.shape[0]), v.view(*shape[:-1], b.shape[0])
    return first(x), second(x)


def silu_pair(first: nn.Module, second: nn.Module, x: Tensor) -> Tensor | None:
    """`F.silu(first(x)) * second(x)` (SwiGLU's hidden row) by one C call where `linear_pair`
    would make its one kernel call (both packed alike, no bias or hooks, one row of float32
    activations on the CPU, no gradient, eager) and gate and up have one width: the products'
    values as that call gives them, the SiLU within float32 rounding of torch's. None
    elsewhere: the caller takes `linear_pair` and torch's ops."""
    if (
        type(first) is not QuantizedLinear
        or type(second) is not QuantizedLinear
        or x.dtype is not torch.float32
        or not x.is_cpu
        or (x.requires_grad and torch.is_grad_enabled())
        or first.bias is not None
        or second.bias is not None
        or torch.compiler.is_compiling()
        or not (_no_hooks(first) and _no_hooks(second))
    ):
        return None
    a: PackedRows = first._modules["packed"]  # type: ignore[assignment]
    b: PackedRows = second._modules["packed"]  # type: ignore[assignment]
    shape = x.shape
    if a.form != b.form or x.numel() != shape[-1] or a.shape[0] != b.shape[0]:
        return None
    pa, pb = a._row_args(), b._row_args()
    if pa is None or pb is None or pa.half != pb.half or not shape[-1] == pa.k == pb.k:
        return None
    # (..., K) -> (1, K) -> (1, N) -> (..., N)
    y = run_pair_silu(x.reshape(1, shape[-1]).contiguous(), a.form == "int4", pa, pb)
    return y.view(*shape[:-1], a.shape[0])


def _pair_matmul(a: PackedRows, b: PackedRows, x: Tensor) -> Tensor | None:
    if torch.compiler.is_compiling():
        return packed_mm_pair(x, a.qs, a.scale, a.zero, b.qs, b.scale, b.zero, a.form)
    pa, pb = a._row_args(), b._row_args()  # (as pair_plans gives them, read as one_row's)
    if pa is None or pb is None or pa.half != pb.half or not x.shape[1] == pa.k == pb.k:
        return None
    return run_pair(x.contiguous(), a.form == "int4", pa, pb)


def _no_hooks(layer: nn.Module) -> bool:
    """No forward hooks (its own or global) and no forward set on the instance: calling the
    module is exactly its forward."""
    return (
        not layer._forward_hooks
        and not layer._forward_pre_hooks
        and "forward" not in layer.__dict__
        and not _module._global_forward_hooks
        and not _module._global_forward_pre_hooks
    )


def weight_like(layer: nn.Module) -> Tensor:
    """A tensor with `layer`'s weight dtype and device, without dequantising a packed one."""
    like = getattr(layer, "weight_like", None)
    if isinstance(like, Tensor):
        return like
    weight = layer._parameters.get("weight")
    return layer.weight if weight is None else weight  # type: ignore[return-value]


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, PackedRows) for m in model.modules())


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def unpack_(module: nn.Module) -> Any:
    """Turn a QuantizedLinear (QuantizedEmbedding) into an nn.Linear (nn.Embedding) holding the
    dequantised weight, in place (the same object, its hooks kept), for code that writes the
    weight (`process_weights_`); other modules are returned as they are."""
    if not isinstance(module, (QuantizedLinear, QuantizedEmbedding)):
        return module
    weight = nn.Parameter(module.weight, requires_grad=False)
    if isinstance(module, QuantizedLinear):
        new: nn.Module = nn.Linear(
            module.in_features, module.out_features, bias=module.bias is not None, device="meta"
        )
        new.bias = module.bias  # type: ignore[assignment]
    else:
        new = nn.Embedding(module.num_embeddings, module.embedding_dim, device="meta")
    new.weight = weight
    hooks = {name: getattr(module, name) for name in _HOOK_DICTS if hasattr(module, name)}
    module.__dict__.clear()
    module.__dict__.update(new.__dict__)
    module.__dict__.update(hooks)
    module.__class__ = type(new)  # type: ignore[assignment]
    return module


def shares_packed(a: nn.Module, b: nn.Module) -> bool:
    """Whether two modules read one packed matrix (a tied embedding and head)."""
    p = getattr(a, "packed", None)
    return isinstance(p, PackedRows) and p is getattr(b, "packed", None)
