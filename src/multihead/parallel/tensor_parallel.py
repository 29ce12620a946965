"""Tensor-parallel heads (Megatron-LM style) for models built from multihead modules, as a plan for
`torch.distributed.tensor.parallel.parallelize_module`.

- `MultiHeadAttention` -> `HeadParallel`: each rank keeps whole heads (see heads.py): its rows of
  the packed `in_proj` (q | k | v) or of q_proj / k_proj / v_proj, as plain local parameters
  (a DTensor placement cannot say "these rows of q, these of k and v", nor replicate a kv head to
  some ranks only), and the module's head counts, position scheme (ALiBi: its heads' slopes) and
  KV caches become the rank's. The output projection is torch's `RowwiseParallel` (DTensor,
  columns in head order): its all-reduce sums the heads of every rank.
- `FeedForward` (fc1 -> fc2) and `SwiGLU` (gate, up -> down): torch's `ColwiseParallel` then
  `RowwiseParallel` (DTensor; weights stored row-major first, which FSDP2 needs); SwiGLU's
  input enters as one replicated DTensor so its gradient is all-reduced once for gate and up.
- Everything else (embeddings, norms, the LM head) stays replicated: every rank holds it whole
  and computes the same values, so its gradients are equal on every rank without communication.

Shapes: x (B, T, C) replicated on every rank; a rank's heads (B, H/tp, T, D).
"""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleInput,
    parallelize_module,
)

from ..hook_points import hooks_for
from ..modules.attention import MultiHeadAttention
from ..modules.feedforward import FeedForward, SwiGLU
from ..positional import ALiBi
from ..positional.scheme import PositionScheme
from .collectives import copy_to_ranks, gather_heads
from .heads import HeadSplit
from .input_agreement import DEFAULT_TIMEOUT, input_check_hook
from .linear_shards import (
    ReplicatedKVLinear,
    RowMajorColwise,
    RowMajorRowwise,
    TensorParallelHeads,
    linear_shard,
    plain_linear,
)


def _position_for_rank(scheme: PositionScheme | None, split: HeadSplit) -> PositionScheme | None:
    """The position scheme of the rank's heads: ALiBi keeps its heads' slopes; RoPE and no
    scheme do not depend on heads; another scheme must say how (`shard_heads(heads)`)."""
    if scheme is None or not _depends_on_heads(scheme):
        return scheme
    heads = split.query_heads()
    if isinstance(scheme, ALiBi):
        mine = copy.deepcopy(scheme)  # the original may serve other modules
        mine.slopes = scheme.slopes[heads.start : heads.stop].clone()
        mine.num_heads = len(heads)
        return mine
    shard = getattr(scheme, "shard_heads", None)
    assert callable(shard)  # checked by check_position_scheme first
    return cast(PositionScheme, shard(heads))


def _depends_on_heads(scheme: PositionScheme) -> bool:
    return type(scheme).bias is not PositionScheme.bias


def check_position_scheme(scheme: PositionScheme | None, where: str) -> None:
    if scheme is None or not _depends_on_heads(scheme) or isinstance(scheme, ALiBi):
        return
    if not callable(getattr(scheme, "shard_heads", None)):
        raise ValueError(
            f"{where}: the position scheme {type(scheme).__name__} adds a per-head bias, and "
            "tensor parallelism needs the bias of each rank's heads: give it a method "
            "shard_heads(heads: range) -> PositionScheme"
        )


class HeadParallel(ParallelStyle):
    """Shard one `MultiHeadAttention` by whole heads over a 1-D device mesh (a ParallelStyle for
    `parallelize_module`). Every rank must hold the same weights before (with `src_data_rank`
    set, the default, the weights of that group rank are broadcast first, as torch's styles do)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, MultiHeadAttention):
            raise TypeError(
                f"HeadParallel shards a MultiHeadAttention, got {type(module).__name__}"
            )
        if getattr(module, "_tensor_parallel", None) is not None:
            raise ValueError("this MultiHeadAttention is already tensor-parallel")
        if module._sequence_parallel is not None:
            raise ValueError("HeadParallel: this MultiHeadAttention is sequence-parallel")
        # per-head sinks and q/k norms over the whole width do not split by heads here
        over = [getattr(n, "over", "head") for n in (module.q_norm, module.k_norm) if n is not None]
        if module.sinks is not None or "width" in over:
            what = (
                "sink logits (sinks)" if module.sinks is not None else "a q/k norm over the width"
            )
            raise ValueError(f"HeadParallel does not shard {what} (OLMo 2, gpt-oss): not supported")
        group = device_mesh.get_group()
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()
        split = HeadSplit.plan(module.num_heads, module.num_kv_heads, module.head_dim, tp, rank)
        check_position_scheme(module.position, "HeadParallel")
        if self.src_data_rank is not None:
            _broadcast_parameters(module, group, self.src_data_rank)
        heads = TensorParallelHeads(split, group, module.packed)
        replicated = split.kv_replicas > 1
        if module.packed:
            old = module.in_proj
            shard = linear_shard(old, split.packed_rows())
            module.in_proj = (
                ReplicatedKVLinear(old, shard, split.packed_kv_slice(), heads)
                if replicated
                else plain_linear(old, shard)
            )
        else:
            q_shard = linear_shard(module.q_proj, split.query_rows())
            module.q_proj = plain_linear(module.q_proj, q_shard)
            for name in ("k_proj", "v_proj"):
                old = getattr(module, name)
                shard = linear_shard(old, split.kv_rows())
                new = ReplicatedKVLinear(old, shard, slice(None), heads) if replicated else (
                    plain_linear(old, shard))  # fmt: skip
                setattr(module, name, new)
        out = RowMajorRowwise()
        out.src_data_rank = self.src_data_rank
        out._apply(module.out_proj, device_mesh)
        module.position = _position_for_rank(module.position, split)
        module.num_heads, module.num_kv_heads = split.local_heads, split.local_kv_heads
        object.__setattr__(module, "_tensor_parallel", heads)  # a plain attribute, not state
        module.register_forward_pre_hook(_copy_inputs_to_ranks, with_kwargs=True)
        module.register_forward_hook(_gather_weights)
        return module


def _broadcast_parameters(module: nn.Module, group: dist.ProcessGroup, src: int) -> None:
    """Every rank takes group rank `src`'s values (torch's styles' single-device semantics)."""
    source = dist.get_global_rank(group, src)
    with torch.no_grad():
        for p in module.parameters():
            full = p.detach().contiguous()  # (weights may be stored column-major)
            dist.broadcast(full, src=source, group=group)
            p.copy_(full)


_INPUTS = ("query", "key", "value")


def _copy_inputs_to_ranks(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Before a tensor-parallel attention runs: its inputs (query, key, value) are replicated and
    read by every rank's heads, so their gradients sum over the ranks (Megatron's f)."""
    heads: TensorParallelHeads = module._tensor_parallel  # type: ignore[assignment]
    hooks = hooks_for(module)
    if hooks is not None and "hook_result" in hooks:
        raise ValueError(
            "hook_result is not available under tensor parallelism: it projects each head "
            "through the output weight, which is split over ranks (the other hook points show "
            "this rank's heads)"
        )
    given = dict(zip(_INPUTS, args, strict=False))
    given.update({n: kwargs[n] for n in _INPUTS if n in kwargs})
    key = given.get("key")
    if (
        heads.packed
        and heads.split.kv_replicas > 1
        and key is not None
        and key is not given.get("query")
        and torch.is_grad_enabled()
    ):
        raise ValueError(
            "cross-attention through a packed in_proj with kv heads replicated over ranks "
            f"(num_kv_heads {heads.split.num_kv_heads} < tensor-parallel size {heads.split.tp}) "
            "cannot be trained under tensor parallelism; build the module with separate "
            "projections (kdim/vdim) or use num_kv_heads >= tp"
        )
    if not torch.is_grad_enabled():
        return args, kwargs
    copies: dict[int, Any] = {}

    def copy_of(t: Any) -> Any:
        if not isinstance(t, Tensor) or not t.requires_grad:
            return t
        if id(t) not in copies:  # key is query stays key is query (self-attention)
            copies[id(t)] = copy_to_ranks(t, heads.group)
        return copies[id(t)]

    new_args = tuple(copy_of(a) for a in args)
    new_kwargs = {n: copy_of(v) if n in _INPUTS else v for n, v in kwargs.items()}
    return new_args, new_kwargs


def _gather_weights(module: nn.Module, args: tuple, output: Any) -> Any:
    """return_weights: the weights of every rank's heads, (B, H, Tq, Tk) as without sharding."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Tensor):
        heads: TensorParallelHeads = module._tensor_parallel  # type: ignore[assignment]
        return output[0], gather_heads(output[1], heads.group)
    return output


def tensor_parallel_plan(model: nn.Module, prefix: str = "") -> dict[str, ParallelStyle]:
    """{module path: style} sharding every MultiHeadAttention (`HeadParallel`), FeedForward and
    SwiGLU of `model`; modules not named stay replicated. Usable with `parallelize_module`;
    `prefix` names `model` inside a larger model, to merge its plan into that model's."""
    plan: dict[str, ParallelStyle] = {}
    for name, module in model.named_modules(prefix=prefix):
        dot = f"{name}." if name else ""
        if isinstance(module, MultiHeadAttention):
            plan[name] = HeadParallel()
        elif isinstance(module, FeedForward):
            plan[f"{dot}fc1"] = RowMajorColwise()
            plan[f"{dot}fc2"] = RowMajorRowwise()
        elif isinstance(module, SwiGLU):
            plan[name] = PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)
            )
            plan[f"{dot}gate"] = RowMajorColwise()
            plan[f"{dot}up"] = RowMajorColwise()
            plan[f"{dot}down"] = RowMajorRowwise()
    return plan


def _check_mesh(mesh: object) -> DeviceMesh:
    if not isinstance(mesh, DeviceMesh) or mesh.ndim != 1:
        raise TypeError(
            "mesh must be a 1-D torch.distributed.DeviceMesh, e.g. init_device_mesh('cuda', "
            "(tp,)) or mesh['tp'] of a 2-D mesh; got "
            + (f"a {mesh.ndim}-D DeviceMesh" if isinstance(mesh, DeviceMesh) else repr(mesh))
        )
    return mesh


def tensor_parallel(
    model: nn.Module, mesh: DeviceMesh, *, timeout: float = DEFAULT_TIMEOUT
) -> nn.Module:
    """Shard `model`'s attention heads and MLPs over the ranks of a 1-D device mesh, in place.

    Every rank calls it on the same model (same weights: seed alike or load the same
    checkpoint). Afterwards every rank gives the model the same (replicated) input and gets the
    same output as the unsharded model; each rank holds 1/tp of the attention and MLP weights
    (kv heads replicated when tp > num_kv_heads). Everything is checked before anything changes.

    Each forward first checks, in one small all-gather, that every rank was given the same
    inputs (shapes, dtypes and a checksum of the values): different inputs raise ValueError on
    every rank, naming the ranks and what differs. `timeout` (seconds, default 300) bounds that
    all-gather: a rank that failed and stays alive makes the others raise TimeoutError instead
    of waiting for the process group's timeout (docs/parallel.md).
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    mesh = _check_mesh(mesh)
    tp = mesh.size()
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            where = name or type(model).__name__
            if getattr(module, "_tensor_parallel", None) is not None:
                raise ValueError(f"{where} is already tensor-parallel")
            if module._sequence_parallel is not None:
                raise ValueError(
                    f"{where}: tensor-parallel heads combined with sequence parallelism are not "
                    "supported"
                )
            try:
                HeadSplit.plan(module.num_heads, module.num_kv_heads, module.head_dim, tp, 0)
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
            check_position_scheme(module.position, where)
        if isinstance(module, FeedForward | SwiGLU):
            hidden = module.fc1.out_features if isinstance(module, FeedForward) else (
                module.gate.out_features)  # fmt: skip
            if hidden % tp != 0:
                raise ValueError(
                    f"{name}: the MLP's hidden width ({hidden}) must be a multiple of the "
                    f"tensor-parallel size ({tp})"
                )
    model = parallelize_module(model, mesh, tensor_parallel_plan(model))
    where = f"tensor_parallel({type(model).__name__})"
    model.register_forward_pre_hook(
        input_check_hook(mesh.get_group(), float(timeout), where), with_kwargs=True
    )
    return model
