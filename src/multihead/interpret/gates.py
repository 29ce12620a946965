"""Per-head gates: scale or zero heads' outputs (before the output projection) for a forward,
without editing weights. All gates at 1 reproduce the model exactly (x * 1.0 == x).

    gates = torch.ones(num_layers, num_heads, requires_grad=True)
    with head_gates(model, gates):
        loss = ...           # d loss / d gates: gradient head importance (Michel et al. 2019)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from ..functional.attention import INTERCEPTORS
from .scope import attention_modules, tracked_names


@contextmanager
def head_gates(model: nn.Module, gates: Tensor | dict[str, Tensor]) -> Iterator[None]:
    """Multiply each head's attention output by its gate while the block runs.

    `gates`: a (layers, heads) tensor, rows in the order of `attention_modules(model)`, or a
    dict from attention module name to a (heads,) tensor (modules not named keep all heads).
    """
    modules = attention_modules(model)
    if isinstance(gates, Tensor):
        if gates.dim() != 2 or gates.shape[0] != len(modules):
            raise ValueError(
                f"gates must have shape (layers, heads) = ({len(modules)}, H), "
                f"got {tuple(gates.shape)}"
            )
        by_name = {name: gates[i] for i, (name, _) in enumerate(modules)}
    else:
        known = {name for name, _ in modules}
        unknown = sorted(set(gates) - known)
        if unknown:
            raise ValueError(f"unknown attention modules {unknown}; known: {sorted(known)}")
        by_name = dict(gates)
    for name, module in modules:
        g = by_name.get(name)
        if g is not None and g.shape != (module.num_heads,):
            raise ValueError(
                f"gates for {name} must have shape ({module.num_heads},), got {tuple(g.shape)}"
            )

    with tracked_names(model) as names:

        def gate(call, backend, run):
            out, weights = run(call, backend)
            g = by_name.get(names.current)
            if g is not None:
                out = out * g.to(out.dtype).view(1, -1, 1, 1)  # (B, H, Tq, Dv) * (1, H, 1, 1)
            return out, weights

        INTERCEPTORS.append(gate)
        try:
            yield
        finally:
            INTERCEPTORS.remove(gate)
