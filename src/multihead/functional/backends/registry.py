"""A registry of attention backends: functions with one signature, chosen by name.

Each backend is `run(call) -> (output, weights or None)` plus `why_not(call) -> list of reasons`
(empty when it can run the call). `backend="auto"` takes the highest-priority backend that can
and, where the backend has a `prefer(call)` test (a cost model), that prefers the call.
A backend declares `structured=True` when it reads a call's structure (window, documents,
prefix) itself; the others receive the call with it folded into a dense mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from ..call import AttentionCall

RunFn = Callable[[AttentionCall], "tuple[Tensor, Tensor | None]"]
WhyNotFn = Callable[[AttentionCall], "list[str]"]
PreferFn = Callable[[AttentionCall], bool]


def _always(call: AttentionCall) -> list[str]:
    return []


@dataclass(frozen=True)
class Backend:
    name: str
    run: RunFn
    why_not: WhyNotFn = field(default=_always)
    priority: int = 0
    structured: bool = False  # reads call.structure itself (else it gets the dense mask)
    prefer: PreferFn | None = None  # auto picks it only where this says it pays
    # auto considers it only for calls with structure: plain calls (the small-call hot path)
    # skip it without asking why_not or prefer
    structure_only: bool = False


_BACKENDS: dict[str, Backend] = {}
_ORDER: list[Backend] = []  # by descending priority; rebuilt on registration
_PLAIN_ORDER: list[Backend] = []  # _ORDER without the structure_only ones: for plain calls


def _reorder() -> None:
    _ORDER[:] = sorted(_BACKENDS.values(), key=lambda b: -b.priority)
    _PLAIN_ORDER[:] = [b for b in _ORDER if not b.structure_only]


def register_backend(
    name: str,
    run: RunFn,
    *,
    why_not: WhyNotFn | None = None,
    priority: int = 0,
    replace: bool = False,
    structured: bool = False,
    prefer: PreferFn | None = None,
    structure_only: bool = False,
) -> Backend:
    """Add a backend. `why_not(call)` lists the reasons it cannot run a call (empty = it can);
    `backend="auto"` tries backends from the highest `priority` down, skipping one whose
    `prefer(call)` is False. `structured=True`: it reads `call.structure` itself;
    `structure_only=True`: auto offers it only calls with structure (it still runs any call
    by name)."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"backend name must be a non-empty string other than 'auto', got {name!r}")
    if name in _BACKENDS and not replace:
        raise ValueError(f"backend {name!r} is already registered (pass replace=True to override)")
    backend = Backend(name, run, why_not or _always, priority, structured, prefer, structure_only)
    _BACKENDS[name] = backend
    _reorder()
    return backend


def unregister_backend(name: str) -> None:
    get_backend(name)
    del _BACKENDS[name]
    _reorder()


def get_backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        known = ", ".join(["auto", *_BACKENDS])
        raise ValueError(f"unknown backend {name!r}; known backends: {known}") from None


def available_backends() -> list[str]:
    """Registered backend names, in the order `backend="auto"` tries them."""
    return [b.name for b in _ORDER]


def first_plain_backend() -> Backend | None:
    """The backend `auto` asks first about a call without structure (None: none registered)."""
    return _PLAIN_ORDER[0] if _PLAIN_ORDER else None


def select_backend(call: AttentionCall, name: str) -> Backend:
    """The backend that runs `call`: the named one (if it can), or the first able one for 'auto'."""
    if name == "auto":
        for backend in _ORDER if call.structure is not None else _PLAIN_ORDER:
            # why_not first: a backend that refuses (e.g. under tracing) never reaches its cost
            # rule, whose size comparisons would be guards on symbolic shapes
            if not backend.why_not(call) and (backend.prefer is None or backend.prefer(call)):
                return backend
        every = {b.name: b.why_not(call) for b in _ORDER}
        raise ValueError(f"no attention backend can run this call: {every}")
    backend = get_backend(name)
    reasons = backend.why_not(call)
    if reasons:
        raise ValueError(f"backend {name!r} cannot run this call: " + "; ".join(reasons))
    return backend
