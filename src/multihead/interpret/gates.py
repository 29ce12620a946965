"""Per-head gates: scale or zero heads' outputs (before the output projection) for a forward,
without editing weights. All gates at 1 reproduce the model exactly (x * 1.0 == x).

    gates = torch.ones(num_layers, num_heads, requires_grad=True)
    with head_gates(model, gates):
        loss = ...           # d loss / d gates: gradient head importance (Michel et al. 2019)

Built on the `hook_z` hook point: it acts only on `model`, only in this thread (context), and
only inside the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from ..hook_points import HookFn, HookSession, module_names
from ..hooked.hooks import eager_only
from ..hooked.scope import attention_modules


def _gate(g: Tensor) -> HookFn:
    def apply(z: Tensor, name: str) -> Tensor:
        # z (B, T, H, D) (packed input: (1, N, H, D)) * (H, 1)
        return z * g.to(z.dtype)[:, None]

    return apply


@contextmanager
def head_gates(model: nn.Module, gates: Tensor | dict[str, Tensor]) -> Iterator[None]:
    """Multiply each head's attention output by its gate while the block runs.

    `gates`: a (layers, heads) tensor, rows in the order of `attention_modules(model)`, or a
    dict from attention module name to a (heads,) tensor (modules not named keep all heads).
    """
    model = eager_only(model, "head_gates()")
    modules = attention_modules(model)
    if isinstance(gates, Tensor):
        if gates.dim() != 2 or gates.shape[0] != len(modules):
            raise ValueError(
                f"gates must have shape (layers, heads) = ({len(modules)}, H), "
                f"got {tuple(gates.shape)}"
            )
        by_name = {name: gates[i] for i, (name, _) in enumerate(modules)}
    elif isinstance(gates, dict):
        known = {name for name, _ in modules}
        unknown = sorted(set(gates) - known)
        if unknown:
            raise ValueError(f"unknown attention modules {unknown}; known: {sorted(known)}")
        by_name = dict(gates)
    else:
        raise TypeError(f"gates must be a tensor or a dict of tensors, got {type(gates).__name__}")
    prefixes = module_names(model)
    fwd_hooks = []
    for name, module in modules:
        g = by_name.get(name)
        if g is None:
            continue
        if not isinstance(g, Tensor) or g.shape != (module.num_heads,):
            got = tuple(g.shape) if isinstance(g, Tensor) else type(g).__name__
            raise ValueError(f"gates for {name} must have shape ({module.num_heads},), got {got}")
        prefix = prefixes[id(module)]
        fwd_hooks.append((f"{prefix}.hook_z" if prefix else "hook_z", _gate(g)))
    with HookSession(model, fwd_hooks, writes=True).active():
        yield
