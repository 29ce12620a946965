"""Counting spies: wrap a module's functions so a test can assert which paths ran."""

from __future__ import annotations


def count_calls(monkeypatch, module, names: dict[str, str]) -> dict[str, int]:
    """Replace each `module.<name>` by a wrapper counting its calls under `names[name]`; the
    returned dict holds the counts (undone with the monkeypatch)."""
    calls = dict.fromkeys(names.values(), 0)

    def wrap(name: str, key: str) -> None:
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    for name, key in names.items():
        wrap(name, key)
    return calls
