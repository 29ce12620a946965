"""An offline English corpus: sentences from the docstrings of the Python standard library.

Read with `ast` from the source files (nothing is imported or executed), in sorted file order,
so the same Python version gives the same corpus.
"""

from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))]
    return [d for n in nodes if (d := ast.get_docstring(n))]


def stdlib_sentences(n: int = 2000, *, min_words: int = 3, max_words: int = 120) -> list[str]:
    """`n` distinct sentences of mixed lengths (a few words to long paragraphs)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    out: list[str] = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "test" in path.parts or path.name.startswith("test"):
            continue
        for doc in _docstrings(path):
            # Paragraphs keep their sentences together; very long ones are split at sentence ends.
            for paragraph in doc.split("\n\n"):
                text = " ".join(paragraph.split())
                parts = [text] if len(text.split()) <= max_words else _SENTENCE_END.split(text)
                for part in parts:
                    words = len(part.split())
                    if min_words <= words <= max_words and part not in seen:
                        seen.add(part)
                        out.append(part)
                        if len(out) == n:
                            return out
    if len(out) < n:
        raise RuntimeError(f"the standard library gave only {len(out)} sentences, {n} asked")
    return out
