"""Hook points: named places where a forward pass shows an activation to observers, which may read
it or replace it. Names follow TransformerLens (`blocks.3.attn.hook_z`).

Nothing is stored on modules and nothing is process-global. A *session* (opened by
`interpret.run_with_hooks`, `run_with_cache`, `capture`, `head_gates`) lives in a ContextVar, so
only the thread (or asyncio task) that opened it sees it, plus worker threads that copy the
caller's context on purpose (`contextvars.copy_context()`, as `SentenceEncoder.encode` does). A
session holds hooks for the modules of one model, found by identity, so another model, or the
same model called from another thread, runs plain.

Modules call `hooks_for(self)` once per forward: None unless a session covers them, so the common
path costs a ContextVar read. Under torch.compile / torch.export it is always None (decided at trace
time, no graph break): compiled graphs carry no hooks; observe the eager module.

A module with hook points declares them in `hook_points` (a class attribute of point names); a
container can rename children in `hook_alias` ("layers" -> "blocks"; "" makes a wrapper
transparent), so every model family exposes the same names, and list its points and children in
forward order in `hook_order` (a block's attention runs between resid_pre and attn_out), so names
are listed in the order they fire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor, nn

# fn(activation, full hook name) -> replacement or None
HookFn = Callable[[Tensor, str], "Tensor | None"]
# observer(module hook prefix, the attention call as run (a `functional.call.AttentionCall`:
# not imported, functional sits on this file), its weights (B, H, Tq, Tk))
AttentionCall = Any
CallObserver = Callable[[str, AttentionCall, Tensor], None]

# Stands for calls of the pure `functional.attention()` made outside any module.
FUNCTION = object()

# (bound once: every attention call asks, and the module attribute lookups show at small shapes)
_is_compiling = torch.compiler.is_compiling
_SESSIONS: ContextVar[tuple[HookSession, ...]] = ContextVar("multihead_hook_sessions", default=())


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def hook_point_names(model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """(full name, module, point) of every hook point in `model`, in forward order for the
    models multihead builds (as their `hook_order` says; otherwise points before children)."""

    def walk(
        module: nn.Module, prefix: str, seen: set[int]
    ) -> Iterator[tuple[str, nn.Module, str]]:
        if id(module) in seen:  # a module shared between parents reports under its first name
            return
        seen.add(id(module))
        points = tuple(getattr(module, "hook_points", ()))
        children = dict(module.named_children())
        alias = getattr(module, "hook_alias", {})
        # `hook_order` interleaves points and children in forward order; what it leaves out
        # follows: points first, then children, in registration order.
        order = [x for x in getattr(module, "hook_order", ()) if x in points or x in children]
        order += [p for p in points if p not in order]
        order += [c for c in children if c not in order]
        for item in order:
            if item in children:
                yield from walk(children[item], join(prefix, alias.get(item, item)), seen)
            else:
                yield join(prefix, item), module, item

    yield from walk(model, "", set())


def module_names(model: nn.Module) -> dict[int, str]:
    """id(module) -> its hook prefix, for every module of `model` that has hook points."""
    return {id(m): name[: -len(point)].rstrip(".") for name, m, point in hook_point_names(model)}


class ModuleHooks:
    """The hooks the active sessions hold for one module, as the module sees them."""

    __slots__ = ("fns", "name", "observers", "writers")

    def __init__(
        self,
        name: str,
        fns: dict[str, list[tuple[HookFn, str]]],
        writers: set[str],
        observers: list[tuple[CallObserver, str]],
    ) -> None:
        self.name = name
        self.fns = fns  # point -> [(fn, the full name that fn is told)]
        self.writers = writers  # points whose fns may return a replacement
        self.observers = observers  # [(observer, module prefix)]

    def __contains__(self, point: str) -> bool:
        return point in self.fns

    def __call__(self, point: str, tensor: Tensor) -> Tensor:
        """Show `tensor` at `point` to its hooks, in order; each may replace it (same shape)."""
        for fn, full in self.fns.get(point, ()):
            out = fn(tensor, full)
            if out is not None:
                if not isinstance(out, Tensor) or out.shape != tensor.shape:
                    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise ValueError(
                        f"hook on {full} returned {got}; a replacement must be a tensor of the "
                        f"activation's shape {tuple(tensor.shape)} (return None to only read)"
                    )
                if out.dtype != tensor.dtype or out.device != tensor.device:
                    raise ValueError(
                        f"hook on {full} returned {out.dtype} on {out.device}; a replacement "
                        f"must have the activation's dtype and device ({tensor.dtype} on "
                        f"{tensor.device})"
                    )
                tensor = out
        return tensor

    def heads(self, point: str, t: Tensor) -> Tensor:
        """Hook a heads-first (B, H, T, D) tensor shown as (B, T, H, D) (TransformerLens' layout);
        a replacement comes back heads-first. Views, no copy."""
        if point not in self.fns:
            return t
        return self(point, t.transpose(1, 2)).transpose(1, 2)

    def observe(self, call: AttentionCall, weights: Tensor) -> None:
        for observer, prefix in self.observers:
            observer(prefix, call, weights)

    @staticmethod
    def merge(found: list[ModuleHooks]) -> ModuleHooks:
        """Several sessions cover one module: outer sessions' hooks run first."""
        fns: dict[str, list[tuple[HookFn, str]]] = {}
        for h in found:
            for point, entries in h.fns.items():
                fns.setdefault(point, []).extend(entries)
        writers = set().union(*(h.writers for h in found))
        observers = [o for h in found for o in h.observers]
        return ModuleHooks(found[0].name, fns, writers, observers)


class HookSession:
    """Hooks for the modules of one model (or, with `model=None`, observers of every attention
    module and functional call), held while the session is open in this context."""

    def __init__(
        self,
        model: nn.Module | None,
        hooks: Sequence[tuple[str, HookFn]] = (),
        *,
        writes: bool = False,
        observer: CallObserver | None = None,
        observer_names: dict[int, str] | None = None,
    ) -> None:
        """`hooks`: (full hook name, fn) pairs, names as `hook_point_names(model)` gives them.
        `writes`: the fns may return replacements (else they only read, and the model's own
        computation is left exactly as it is). `observer`: sees every attention call of the
        model's attention modules, told the module's name from `observer_names` (id -> name;
        default its hook prefix)."""
        self.model = model
        self._by_module: dict[int, ModuleHooks] = {}
        self._modules: list[nn.Module] = []  # keeps the ids above alive while open
        self._any: ModuleHooks | None = None
        if model is None:
            watchers = [] if observer is None else [(observer, "attention")]
            self._any = ModuleHooks("attention", {}, set(), watchers)
            return
        wanted: dict[str, list[HookFn]] = {}
        for name, fn in hooks:
            wanted.setdefault(name, []).append(fn)
        names = observer_names or {}
        for full, module, point in hook_point_names(model):
            entry = self._by_module.get(id(module))
            if entry is None:
                prefix = full[: -len(point)].rstrip(".")
                watchers = []
                if observer is not None and "hook_pattern" in getattr(module, "hook_points", ()):
                    watchers = [(observer, names.get(id(module), prefix))]
                entry = ModuleHooks(prefix, {}, set(), watchers)
                self._by_module[id(module)] = entry
                self._modules.append(module)
            for fn in wanted.get(full, ()):
                entry.fns.setdefault(point, []).append((fn, full))
                if writes:
                    entry.writers.add(point)
        # Modules nobody hooks need no entry: their forward stays on the plain path.
        self._by_module = {k: v for k, v in self._by_module.items() if v.fns or v.observers}

    def lookup(self, module: Any) -> ModuleHooks | None:
        if self._any is not None:
            is_attention = module is FUNCTION or "hook_pattern" in getattr(
                module, "hook_points", ()
            )
            return self._any if is_attention else None
        return self._by_module.get(id(module))

    @contextmanager
    def active(self) -> Iterator[HookSession]:
        """Open the session in the current context; closing removes exactly this session, so
        sessions may close in any order (and on exceptions)."""
        _SESSIONS.set((*_SESSIONS.get(), self))
        try:
            yield self
        finally:
            _SESSIONS.set(tuple(s for s in _SESSIONS.get() if s is not self))


def hooks_for(module: Any) -> ModuleHooks | None:
    """The hooks of `module` in the sessions open in this context; None on the plain path."""
    if _is_compiling():
        return None
    sessions = _SESSIONS.get()
    if not sessions:
        return None
    found = [h for s in sessions if (h := s.lookup(module)) is not None]
    if not found:
        return None
    return found[0] if len(found) == 1 else ModuleHooks.merge(found)


def observed(model: Any) -> bool:
    """Whether a session open in this context covers any module of `model` (calls that run a
    model several times, `SentenceEncoder.encode` and `generate`, then run it the way the
    hooks can see: one text at a time, no compiled steps)."""
    if torch.compiler.is_compiling() or not _SESSIONS.get():
        return False
    return any(hooks_for(m) is not None for m in model.modules())


class _Replacement:
    """A session that shows fixed tensors at some hook points of one module, ahead of every
    other session's hooks (see `replacing`)."""

    def __init__(self, module: nn.Module, values: dict[str, Tensor]) -> None:
        self.module = module

        def fn_for(value: Tensor) -> HookFn:
            return lambda activation, name: value

        fns = {point: [(fn_for(v), point)] for point, v in values.items()}
        self.hooks = ModuleHooks("", fns, set(values), [])

    def lookup(self, module: Any) -> ModuleHooks | None:
        return self.hooks if module is self.module else None


@contextmanager
def replacing(module: nn.Module, values: dict[str, Tensor]) -> Iterator[None]:
    """Inside the block, `module`'s hook points named in `values` carry these tensors instead of
    what the module computed (in the layout hooks see), before any hook of the open sessions
    sees them: how a block hands attention the q, k, v it computed from per-head inputs."""
    replacement = _Replacement(module, values)
    _SESSIONS.set((replacement, *_SESSIONS.get()))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _SESSIONS.set(tuple(s for s in _SESSIONS.get() if s is not replacement))


def caches_as(kind: str) -> Any:
    """Mark a method that runs the model several times with how its forwards combine in
    `run_with_cache(model.method, ...)`: "positions" (`CausalLM.generate`: one cache over the
    sequence) or "sequences" (`SentenceEncoder.encode`: one per text); see
    `multihead.hooked.steps`."""

    def mark(fn: Any) -> Any:
        if kind not in ("positions", "sequences"):
            raise ValueError(f"kind must be 'positions' or 'sequences', got {kind!r}")
        fn.cache_steps = kind
        return fn

    return mark
