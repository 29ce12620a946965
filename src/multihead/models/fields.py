"""Typed reads of a config.json, each error naming the model type, the field and the value.

Every family reads its config through `Fields`, so every number is range-checked before anything
is built: sizes are ints in [1, MAX_SIZE] (a config asking for 2**40-wide layers fails here, not
in an allocator), epsilons lie in (0, MAX_EPSILON], dropouts in [0, 1); and a field that would
change the computation in a way multihead does not implement is refused by name (`refuse`),
never silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

_REQUIRED: Any = object()
# Larger than any released model's vocabulary, width, context or window (16.7 million), small
# enough that a config cannot make a loader build for minutes before the weights refute it.
MAX_SIZE = 2**24
MAX_EPSILON = 0.1  # norm epsilons are 1e-12 .. 1e-5 in practice; 0.1 would swamp the variance


class Fields:
    def __init__(self, config: dict, model_type: str) -> None:
        self.config = config
        self.model_type = model_type

    def _where(self, key: str) -> str:
        return f"config.json ({self.model_type}): {key}"

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def _absent(self, key: str, default: Any) -> bool:
        """True when `key` is absent or null (then `default` applies, unless required)."""
        if self.has(key):
            return False
        if default is _REQUIRED:
            raise ValueError(f"config.json ({self.model_type}) lacks {key}")
        return True

    def int(
        self, key: str, default: Any = _REQUIRED, *, minimum: int = 1, maximum: int = MAX_SIZE
    ) -> Any:
        """An int in [minimum, maximum] (sizes: >= 1), or `default` (which may be None) when
        absent."""
        if self._absent(key, default):
            return default
        value = self.config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            raise ValueError(f"{self._where(key)} must be {kind}, got {value!r}")
        if value > maximum:
            raise ValueError(f"{self._where(key)} = {value!r} is too large (at most {maximum})")
        return value

    def number(
        self,
        key: str,
        default: Any = _REQUIRED,
        *,
        positive: bool = True,
        minimum: float | None = None,
        maximum: float = math.inf,
    ) -> Any:
        """A finite float (> 0 when `positive`, else >= 0; >= `minimum` when given) and <=
        `maximum`, or `default` when absent."""
        if self._absent(key, default):
            return default
        value = self.config[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (value > 0 if positive else value >= 0)
        if not ok:
            kind = "a positive number" if positive else "a number >= 0"
            raise ValueError(f"{self._where(key)} must be {kind}, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"{self._where(key)} must be a number >= {minimum:g}, got {value!r}")
        if value > maximum:
            raise ValueError(f"{self._where(key)} = {value!r} is too large (at most {maximum:g})")
        return float(value)

    def epsilon(self, key: str, default: float) -> float:
        """A norm epsilon in (0, MAX_EPSILON]."""
        value: float = self.number(key, default, maximum=MAX_EPSILON)
        return value

    def probability(self, key: str, default: float = 0.0) -> float:
        """A dropout probability in [0, 1)."""
        value = self.number(key, default, positive=False)
        if value >= 1:
            raise ValueError(f"{self._where(key)} must be in [0, 1), got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        if self._absent(key, default):
            return default
        value = self.config[key]
        if not isinstance(value, bool):
            raise ValueError(f"{self._where(key)} must be true or false, got {value!r}")
        return value

    def choice(self, key: str, default: Any, choices: tuple[str, ...] | dict) -> str:
        value = default if self._absent(key, default) else self.config[key]
        if not isinstance(value, str) or value not in choices:
            known = ", ".join(sorted(choices))
            raise ValueError(f"{self._where(key)} = {value!r} is not supported; known: {known}")
        return value

    def refuse(self, key: str, allowed: Callable[[Any], bool], why: str) -> None:
        """ValueError when `key` is present and `allowed(value)` is false."""
        if key in self.config and not allowed(self.config[key]):
            raise ValueError(f"{self._where(key)} = {self.config[key]!r} is not supported: {why}")


def unsupported_architecture(config: dict, loader: str, known: list[str]) -> ValueError:
    archs = ", ".join(config.get("architectures") or []) or "none listed"
    return ValueError(
        f"unsupported architecture: model_type {config.get('model_type')!r} "
        f"(architectures: {archs}); {loader} reads model_type {', '.join(map(repr, known))}"
    )
