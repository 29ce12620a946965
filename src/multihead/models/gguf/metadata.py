"""Typed reads of GGUF metadata (`{arch}.block_count`, ...), each error naming the file and
the key, for the families' GGUF -> config.json translations."""

from __future__ import annotations

from typing import Any

_REQUIRED: Any = object()


class Metadata:
    def __init__(self, values: dict[str, Any], source: str) -> None:
        self.values = values
        self.source = source
        self.arch = values.get("general.architecture")

    def get(self, key: str, default: Any = _REQUIRED, *, kind: type = int) -> Any:
        """`{arch}.{key}` (or `key` itself when it starts with 'general.' or 'tokenizer.')."""
        full = key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
        value = self.values.get(full)
        if value is None:
            if default is _REQUIRED:
                raise ValueError(f"{self.source}: GGUF metadata lacks {full}")
            return default
        ok = (
            isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        )
        if not ok:
            raise ValueError(
                f"{self.source}: GGUF metadata {full} must be {kind.__name__}, got {value!r}"
            )
        return float(value) if kind is float else value

    def token_count(self) -> int | None:
        tokens = self.values.get("tokenizer.ggml.tokens")
        return len(tokens) if isinstance(tokens, list) else None
