"""multihead: multi-head attention for PyTorch, correct, fast and inspectable.

The names below are imported on first use (PEP 562 module `__getattr__`), so `import multihead`
and the `multihead` command's `--help` do not pay for importing torch."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"  # the one source: pyproject.toml reads it (tool.setuptools.dynamic)

# public name -> the submodule that defines it
_LAZY = {
    "CausalLM": "models.lm",
    "FactoredMatrix": "factored_matrix",
    "LMConfig": "modules.lm",
    "MultiHeadAttention": "modules",
    "attention": "functional",
    "load": "pretrained.auto",
    "scaled_dot_product_attention": "functional",
    "show": "interpret.head_view",
    "wrap": "bridge",
}

__all__ = [
    "CausalLM",
    "FactoredMatrix",
    "LMConfig",
    "MultiHeadAttention",
    "__version__",
    "attention",
    "functional",
    "load",
    "scaled_dot_product_attention",
    "show",
    "wrap",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from . import functional
    from .bridge import wrap
    from .factored_matrix import FactoredMatrix
    from .functional import attention, scaled_dot_product_attention
    from .interpret.head_view import show
    from .models.lm import CausalLM
    from .modules import MultiHeadAttention
    from .modules.lm import LMConfig
    from .pretrained.auto import load


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        value = importlib.import_module(f".{name}", __name__)  # a submodule, e.g. .functional
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
