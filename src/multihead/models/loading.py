"""Build a model from a checkpoint without materialising random weights first.

1. the family reads config.json into our config (every number range-checked by name, fields
   that contradict each other refused);
2. the config's layer count is checked against the layers the checkpoint's header holds (a
   config asking for a billion layers over a 2-layer checkpoint fails here, before a module is
   built: building even on the meta device takes time per layer);
3. the model is built on the meta device (shapes only, no memory);
4. its key map is matched against the checkpoint's header: every missing, unexpected or
   mis-shaped tensor is named before anything is read (a config asking for 30 million
   vocabulary rows fails here, at no cost);
5. each tensor is read once into its final dtype and device, checked finite, and handed to
   the module with `load_state_dict(assign=True)`.
Peak memory is the model's size (plus one tensor in flight), not twice it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .checkpoint import WEIGHT_DTYPES, Checkpoint, describe_dtype
from .keymap import LAYER, Rule, Source, plan_state_dict


def _same(key: str) -> str | None:
    return key


@dataclass(frozen=True)
class Family:
    """One kind of checkpoint: its config reader, module and key map, side by side."""

    read_config: Callable[[dict], Any]
    build: Callable[..., nn.Module]  # build(config, device=..., dtype=...)
    key_map: Callable[[Any], list[Rule]]
    num_layers: Callable[[Any], int]
    rename: Callable[[str], str | None] = _same  # checkpoint key -> key-map spelling; None: skip
    ignored: tuple[str, ...] = ()  # checkpoint keys not ours (prefixes; '.x' = suffixes)
    tied: Callable[[Any], dict[str, str]] = field(default=lambda config: {})  # alias -> key
    finish: Callable[[nn.Module], None] | None = None  # after the weights are in
    # fused tensors presented as the parts the key map reads (see view.py)
    view: Callable[[Checkpoint, Any], Checkpoint] | None = None


def check_dtype_and_device(dtype: object, device: torch.device | str | None) -> torch.device:
    if dtype is not None and dtype not in WEIGHT_DTYPES:
        known = ", ".join(describe_dtype(d) for d in WEIGHT_DTYPES)
        raise TypeError(f"dtype must be None or a floating torch.dtype ({known}), got {dtype!r}")
    try:
        place = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must name a torch device, got {device!r} ({e})") from None
    if place.type == "meta":
        raise ValueError("device='meta' holds no weights; give the device to load them onto")
    try:  # a CPU-only torch accepts torch.device("cuda") and fails later with an AssertionError
        torch.empty(0, device=place)
    except (RuntimeError, AssertionError) as e:
        hint = (
            "this torch was built without CUDA"
            if place.type == "cuda" and not torch.backends.cuda.is_built()
            else "no CUDA device is visible"
            if place.type == "cuda"
            else str(e).splitlines()[0]
        )
        raise ValueError(f"device {str(device)!r} is not available: {hint}") from None
    return place


def _choose_dtype(plan: dict[str, Source], checkpoint: Checkpoint, names: dict[str, str]) -> Any:
    """The dtype holding the most elements among the tensors loaded; refuses non-float ones."""
    counts: dict[torch.dtype, int] = {}
    bad = []
    for source in plan.values():
        for key in source.keys:
            info = checkpoint.infos[names[key]]
            if info.dtype in WEIGHT_DTYPES:
                assert isinstance(info.dtype, torch.dtype)
                counts[info.dtype] = counts.get(info.dtype, 0) + info.numel
            else:
                bad.append(f"{names[key]} ({describe_dtype(info.dtype)})")
    if bad:
        raise ValueError(
            f"{checkpoint.source}: weights must be floating point (float64/32/16, bfloat16); "
            f"integer, boolean or quantized (float8) tensors: {', '.join(bad[:10])}"
        )
    return max(counts, key=lambda d: counts[d]) if counts else torch.float32


def _all_finite(t: Tensor) -> bool:
    # min and max are NaN when any value is, +-inf when any value is: one reduction pass with no
    # temporary (an isfinite mask would be a boolean copy of the tensor)
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t.reshape(-1))
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _materialize(
    target: str,
    source: Source,
    checkpoint: Checkpoint,
    names: dict[str, str],
    dtype: torch.dtype,
    device: torch.device,
    stride: tuple[int, ...] | None = None,
) -> Tensor:
    # in the layout the module keeps (CausalLM keeps matrices column-major): relaying them out
    # after loading would copy each one, and the freed copies stay in the process's heap
    out = (
        torch.empty_strided(source.shape, stride, dtype=dtype, device=device)
        if stride is not None
        else torch.empty(source.shape, dtype=dtype, device=device)
    )
    rows = out.t() if source.transpose and out.dim() == 2 else out  # the sources' layout
    start = 0
    for key in source.keys:
        n = checkpoint.infos[names[key]].shape[0]
        # read straight into a contiguous CPU slice of the stored dtype; else via a copy
        checkpoint.read(names[key], out=rows if len(source.keys) == 1 else rows[start : start + n])
        start += n
    if not _all_finite(out):
        cast = (
            ""
            if all(checkpoint.infos[names[k]].dtype == dtype for k in source.keys)
            else (f" after conversion to {describe_dtype(dtype)}")
        )
        raise ValueError(
            f"{checkpoint.source}: {', '.join(names[k] for k in source.keys)} holds NaN or "
            f"infinite values{cast} (for {target})"
        )
    return out


def _stored_layers(rules: list[Rule], names: dict[str, str]) -> tuple[int, str]:
    """(layers the checkpoint holds, the key pattern that says so): one past the highest layer
    index in any key a per-layer rule reads; (0, "") when no key has one."""
    layered = {s for r in rules if LAYER in r.target for s in r.sources if LAYER in s}
    patterns = {
        s: re.compile(re.escape(s).replace(re.escape(LAYER), r"(\d+)")) for s in sorted(layered)
    }
    top, where = -1, ""
    for key in names:
        for source, pattern in patterns.items():
            match = pattern.fullmatch(key)
            if match and int(match.group(1)) > top:
                top, where = int(match.group(1)), source
    return top + 1, where


def _check_layer_count(family: Family, config: Any, names: dict[str, str], source: str) -> None:
    wanted = family.num_layers(config)
    stored, pattern = _stored_layers(family.key_map(config), names)
    if wanted != stored:
        what = "missing" if wanted > stored else "unexpected"
        first = pattern.replace(LAYER, str(min(wanted, stored)))
        where = f" (from {first!r} on, layers are {what})" if pattern else ""
        raise ValueError(
            f"the config asks for {wanted} layers but the checkpoint {source} holds {stored}"
            f"{where}: the config does not describe these weights"
        )


def load_model(
    family: Family,
    raw_config: dict,
    checkpoint: Checkpoint,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    pack: Callable[..., set[str]] | None = None,
) -> nn.Module:
    """The family's model, built from `raw_config` and filled from `checkpoint`, in eval mode.
    `pack(model, plan, names, tied, dtype, device)` may replace modules by packed (quantized)
    ones before the other tensors are read; it returns the plan targets it filled."""
    place = check_dtype_and_device(dtype, device)
    config = family.read_config(raw_config)
    if family.view is not None:
        checkpoint = family.view(checkpoint, config)
    names: dict[str, str] = {}  # key-map spelling -> checkpoint key
    for key in checkpoint.infos:
        renamed = family.rename(key)
        if renamed is None:
            continue
        if renamed in names:
            raise ValueError(
                f"{checkpoint.source}: {names[renamed]!r} and {key!r} are the same tensor "
                f"({renamed!r}) in two spellings"
            )
        names[renamed] = key
    _check_layer_count(family, config, names, checkpoint.source)
    model = family.build(config, device="meta")
    tied = family.tied(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in tied}
    strides = {k: v.stride() for k, v in model.state_dict().items()}
    plan = plan_state_dict(
        {k: checkpoint.infos[v].shape for k, v in names.items()},
        family.key_map(config),
        num_layers=family.num_layers(config),
        expected=expected,
        ignored=family.ignored,
        spelling=names,
    )
    stored = _choose_dtype(plan, checkpoint, names)  # also refuses integer weights
    chosen = dtype or stored
    with checkpoint:
        packed = set() if pack is None else pack(model, plan, names, tied, chosen, place)
        state = {
            target: _materialize(
                target, source, checkpoint, names, chosen, place, strides.get(target)
            )
            for target, source in plan.items()
            if target not in packed
        }
    for alias, key in tied.items():
        if alias not in packed:
            state[alias] = state[key]
    with torch.no_grad():
        if packed:  # the packed modules hold their tensors already
            state.update((k, v) for k, v in model.state_dict().items() if k not in state)
        model.load_state_dict(state, strict=True, assign=True)
    state.clear()  # the modules hold the tensors now; `finish` may replace some (layouts)
    model.to(place)  # buffers made at construction (RoPE tables) follow the weights
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"loading left tensors without values: {', '.join(left)}")
    if family.finish is not None:
        family.finish(model)
    return model.eval()
