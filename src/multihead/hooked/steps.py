"""Caches of calls that run the model several times: `run_with_cache(model.generate, ...)` and
`run_with_cache(encoder.encode, ...)` (`run_with_hooks` takes them the same way).

A method says how its forwards combine through its `cache_steps` attribute (set by
`multihead.hook_points.caches_as`):

  "positions" (`CausalLM.generate`): ONE cache over the whole sequence. Each step's
      activations are concatenated along positions (dim 1: (B, T, ...)); a step's pattern and
      scores (B, H, Tq, Tk) are placed in a (B, H, N, N) grid, its queries at their positions
      and its keys right-aligned to its last query (a KV cache holds the latest keys; a window
      cache the latest window). Keys a step did not attend read 0 in the pattern and -inf in
      the scores, as a full forward's mask shows them. N = prompt + new tokens - 1 (the last
      token is sampled, never fed back): the cache equals that of one forward over the
      generated sequence at every position.
  "sequences" (`SentenceEncoder.encode`): a list of caches, one per text, in input order
      (encode runs each text alone while hooks observe it; see `SentenceEncoder.encode`).

A plain model call keeps one cache (a hook point seen twice keeps its last activation).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .activation_cache import ActivationCache

POSITIONS, SEQUENCES = "positions", "sequences"
WEIGHT_FILL = {"hook_pattern": 0.0, "hook_attn_scores": float("-inf")}


def call_target(target: Any, unwrap: Callable[[nn.Module], nn.Module]) -> tuple[nn.Module, Any]:
    """(the module to hook, what to call): a model, or a bound method of one
    (`model.generate`, `encoder.encode`; of a torch.compile wrapper: its eager module's)."""
    if inspect.ismethod(target) and isinstance(target.__self__, nn.Module):
        module = unwrap(target.__self__)
        return module, getattr(module, target.__name__)
    if not isinstance(target, nn.Module):
        raise TypeError(
            "model must be an nn.Module or a bound method of one (model.generate, "
            f"encoder.encode), got {type(target).__name__}"
        )
    module = unwrap(target)
    return module, module


def ran(out: Any, call: Any) -> Any:
    """`out`, refused when the call returned a generator: it would run after the hooks closed
    (iterate `generate_stream` inside `hooks()` or `capture()` instead)."""
    if inspect.isgenerator(out):
        raise TypeError(
            f"{getattr(call, '__qualname__', call)} returned a generator, which would run after "
            "the hooks are gone: iterate it inside `with hooks(...)` or `with capture(...)`"
        )
    return out


def combine(call: Any, store: dict[str, list[Tensor]], model: nn.Module | None = None) -> Any:
    """The cache (or caches) of one `run_with_cache` call from each hook point's activations
    in the order they were seen; `model` (the hooked module) goes with each cache for its
    residual-stream algebra."""
    kind = getattr(call, "cache_steps", None)
    if isinstance(call, nn.Module) or (kind is None and all(len(a) == 1 for a in store.values())):
        return ActivationCache({name: acts[-1] for name, acts in store.items()}, model)
    if kind is None:
        runs = max(len(a) for a in store.values())
        raise ValueError(
            f"{getattr(call, '__qualname__', call)} ran the model {runs} times: run_with_cache "
            "combines the forwards of generate (by position) and encode (by text); observe "
            "other calls with hooks() or capture()"
        )
    counts = {len(a) for a in store.values()}
    if len(counts) > 1:
        raise ValueError(f"hook points were seen {sorted(counts)} times: the runs do not align")
    if kind == SEQUENCES:
        runs = counts.pop() if counts else 0
        return [ActivationCache({n: a[i] for n, a in store.items()}, model) for i in range(runs)]
    return ActivationCache({name: _by_position(name, acts) for name, acts in store.items()}, model)


def _by_position(name: str, acts: list[Tensor]) -> Tensor:
    point = name.rsplit(".", 1)[-1]
    if point not in WEIGHT_FILL:
        return torch.cat(acts, dim=1)  # (B, T_s, ...) -> (B, N, ...)
    B, H = acts[0].shape[:2]
    N = sum(a.shape[2] for a in acts)
    grid = acts[0].new_full((B, H, N, N), WEIGHT_FILL[point])
    end = 0
    for a in acts:  # (B, H, Tq, Tk): queries end..end+Tq, keys right-aligned to the last one
        Tq, Tk = a.shape[2:]
        end += Tq
        if Tk > end:
            raise ValueError(f"{name}: a step attends {Tk} keys but only {end} positions exist")
        grid[:, :, end - Tq : end, end - Tk : end] = a
    return grid
