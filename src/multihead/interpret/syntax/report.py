"""The HTML page of `multihead syntax`: the Clark-style table, and for one relation each
sentence's words with the annotated arcs (above) and where the best head looks (below: green
when it finds the target, red when not). Self-contained: inline CSS and SVG, no script, no CDN."""

from __future__ import annotations

from html import escape

from .run import SyntaxResult
from .scoring import RelationScore, pairs

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:14px}td,th{padding:2px 8px;text-align:right}
td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}tr:nth-child(even){background:#f4f4f4}
.s{margin:10px 0}.w{font-size:14px}.gold{stroke:#3465a4}.ok{stroke:#2e9a3a}.bad{stroke:#c33}
svg path{fill:none;stroke-width:1.6}
"""
CHAR, PAD, MAX_SENTENCES = 8.0, 14.0, 80


def _table(result: SyntaxResult) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "relation",
            "direction",
            "pairs",
            "best head",
            "accuracy",
            "95% CI",
            "baseline offset",
            "baseline",
            "margin",
        )
    )
    body = "".join(
        f"<tr><td>{escape(r.relation)}</td><td>{escape(r.direction)}</td><td>{r.count}</td>"
        f"<td>L{r.layer} H{r.head}</td><td>{r.accuracy:.3f}</td>"
        f"<td>{r.ci[0]:.3f}-{r.ci[1]:.3f}</td><td>{r.baseline_offset:+d}</td>"
        f"<td>{r.baseline_accuracy:.3f}</td><td>{r.margin:+.3f}</td></tr>"
        for r in result.rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _arc(x1: float, x2: float, base: float, up: bool, cls: str) -> str:
    height = min(60.0, 12 + abs(x2 - x1) / 4) * (-1 if up else 1)
    mid = (x1 + x2) / 2
    return (
        f'<path class="{cls}" d="M{x1:.0f},{base:.0f} Q{mid:.0f},{base + 2 * height:.0f} '
        f'{x2:.0f},{base:.0f}" marker-end="url(#a)"/>'
    )


def _sentence_svg(result: SyntaxResult, index: int, row: RelationScore) -> str | None:
    sentence = result.sentences[index]
    arcs = [
        (q, t)
        for q, t, rel in pairs(sentence, row.direction, result.causal)[0]
        if rel == row.relation
    ]
    if not arcs:
        return None
    xs, at = [], PAD
    for w in sentence.words:
        width = CHAR * len(w) + PAD
        xs.append(at + width / 2)
        at += width
    top, base = 70.0, 90.0
    parts = [
        f'<text class="w" x="{x:.0f}" y="{base:.0f}" text-anchor="middle">{escape(w)}</text>'
        for x, w in zip(xs, sentence.words, strict=True)
    ]
    forward = row.direction == "dependent->head"
    found = (result.predicted if forward else result.attended)[index][row.layer, row.head]  # (W,)
    for q, t in arcs:
        parts.append(_arc(xs[q], xs[t], top, True, "gold"))
        p = int(found[q if forward else t])  # the prediction; -1: no candidate
        if p >= 0:  # dependent->head: q looks at p; head->dependent: p looks at t most
            src, dst = (q, p) if forward else (p, t)
            ok = p == (t if forward else q)
            parts.append(_arc(xs[src], xs[dst], base + 8, False, "ok" if ok else "bad"))
    marker = (
        '<defs><marker id="a" viewBox="0 0 6 6" refX="5" refY="3" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0L6,3L0,6" style="stroke:#555"/>'
        "</marker></defs>"
    )
    return (
        f'<div class="s"><svg width="{at + PAD:.0f}" height="165">{marker}{"".join(parts)}'
        f"</svg></div>"
    )


def html_page(result: SyntaxResult, show: str | None = None) -> str:
    """The report; `show`: the relation drawn (default: the table's first row); the drawing
    uses its dependent->head row when that direction was scored."""
    if not result.rows:
        raise ValueError("no relation was scored: nothing to draw")
    if show is None:
        row = result.rows[0]
    else:
        mine = [r for r in result.rows if r.relation == show]
        if not mine:
            scored = sorted({r.relation for r in result.rows})
            raise ValueError(f"--show {show!r} is not a scored relation; scored: {scored}")
        row = next((r for r in mine if r.direction == "dependent->head"), mine[0])
    svgs = [s for i in range(len(result.sentences)) if (s := _sentence_svg(result, i, row))]
    more = len(svgs) - MAX_SENTENCES
    note = f"<p>… and {more} more sentences</p>" if more > 0 else ""
    L, H = result.shape
    title = f"{escape(result.model)}: heads and syntax"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{CSS}</style></head><body><h1>{title}</h1>"
        f"<p>{L} layers x {H} heads, {len(result.sentences)} sentences, {result.words} words. "
        f"Accuracy (Clark et al. 2019): dependent->head, how often the dependent's "
        f"most-attended other word is its head; head->dependent, how often the word attending "
        f"most to the dependent is its head; baseline: the best "
        f"fixed offset; 95% CI: bootstrap over sentences.</p>{_table(result)}"
        f"<h2>{escape(row.relation)} ({escape(row.direction)}): L{row.layer} H{row.head}</h2>"
        f"<p>Above, blue: the annotated arcs (query to target). Below: the head's link "
        f"for each pair, green when it is the target, red when not.</p>"
        f"{''.join(svgs[:MAX_SENTENCES])}{note}</body></html>"
    )
