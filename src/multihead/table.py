"""Plain aligned text tables for the command line."""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[str]], *, left: tuple[int, ...] = (0,)) -> str:
    """A plain aligned text table: columns in `left` align left, the rest (numbers) right."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i in left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
