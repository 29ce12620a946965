"""One self-contained HTML report: scripts, styles and data inline; no request to any network
address; element ids prefixed per report so several reports can share a page (or a Jupyter
notebook: `HTMLReport` displays itself inline).

Weights travel compactly: integers in units of 1e-4 (as in the JSON report), as uint16 split
into a high-byte and a low-byte plane (the high bytes are nearly all zero), deflated and base64
encoded; the page inflates them with the browser's DecompressionStream. A 256-token MiniLM
report is about 4.5 MB instead of 12.6 MB of base64 uint16.

A causal report greys out the upper triangle (keys after the query, which a causal head cannot
see) and shows metrics a causal pattern does not define (next-token mass) as "n/a"."""

from __future__ import annotations

import base64
import html
import json
import secrets
import zlib
from importlib import resources
from pathlib import Path

import numpy as np

from ..atomic import write_text_atomic
from .analysis import Analysis
from .roles import RULES, SOURCE_NAMES, strongest

TABLE_METRICS = (
    "previous",
    "next",
    "self",
    "positional",
    "special",
    "punctuation",
    "entropy_norm",
    "confidence",
    "confidence_content",
    "duplicate",
    "induction",
    "previous_best",
    "previous_distance",
    "induction_best",
    "induction_offset",
)
WEIGHT_UNIT = 1e-4


# Inside <script>, the HTML parser ends the element at `</script` and enters a "double
# escaped" state at `<!--` followed by `<script` (the page goes blank); `&` and `>` are harmless
# there but escaped too, so a payload is also safe in an attribute or a comment. U+2028/2029 end
# a line in old JavaScript engines. JSON's \uXXXX escapes keep every value the same.
_SCRIPT_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def script_json(data: object) -> str:
    """`data` as JSON that can stand inside an HTML `<script>` element whatever its strings
    hold (`</script>`, `<!--<script>`, U+2028): every `<`, `>`, `&`, U+2028 and U+2029 written
    as a JSON escape, so the script parses to exactly `data`."""
    return json.dumps(data, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


def asset(name: str) -> str:
    """The text of one of the package's report assets (interpret/assets/)."""
    return (resources.files("multihead.interpret") / "assets" / name).read_text("utf-8")


def pack_weights(attn: np.ndarray) -> str:
    """(L, H, T, T) weights in [0, 1] -> base64 of the deflated high-byte then low-byte planes
    of uint16 values in units of 1e-4 (what report.js `unpack` reverses)."""
    units = np.rint(np.clip(attn.astype(np.float64), 0, 1) / WEIGHT_UNIT).astype("<u2")  # <= 10000
    planes = units.reshape(-1).view(np.uint8).reshape(-1, 2)  # little-endian: [low, high]
    data = np.concatenate([planes[:, 1], planes[:, 0]]).tobytes()
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


def opening_head(analysis: Analysis, open_head=None) -> tuple[int, int]:
    """The head a report opens with: the one asked for, else the strongest role measured on the
    text, else the strongest role, else layer 0, head 0."""
    if open_head is not None:
        return int(open_head[0]), int(open_head[1])
    best = strongest(analysis.roles, 1, source="text") or strongest(analysis.roles, 1)
    return (best[0].layer, best[0].head) if best else (0, 0)


def report_data(
    analysis: Analysis, *, text_index: int = 0, title: str = "", open_head=None
) -> dict:
    item = analysis.texts[text_index]
    L, H = analysis.shape
    roles = [
        [
            [
                {
                    "role": r.role,
                    "text": r.description
                    + (f" (95% CI {r.ci[0]:.2f}-{r.ci[1]:.2f})" if r.ci else ""),
                    "source": r.source,
                    "ci": list(r.ci) if r.ci else None,
                }
                for r in head
            ]
            for head in analysis.roles[layer]
        ]
        for layer in range(L)
    ]
    notes = list(analysis.notes)
    N = len(analysis.texts)
    if N > 1:  # the weights shown are one text's; the roles and metrics are over the corpus
        shown = item.text if len(item.text) <= 80 else item.text[:79] + "…"
        notes.append(
            f"The heatmaps and line views show text {text_index + 1} of {N} ({shown!r}); the "
            f"roles, their 95% intervals (bootstrap over the texts) and the metrics are over "
            f"all {N} texts."
        )
    names = [m for m in TABLE_METRICS if m in analysis.metrics or m in analysis.undefined]
    return {
        "id": "mh-" + secrets.token_hex(4),
        "title": title,
        "L": L,
        "H": H,
        "tokens": item.tokens,
        "tokens_total": item.total_tokens,
        "notes": notes,
        "special": item.special,  # per token: hidden by "hide special tokens"
        "word_starts": item.word_starts,  # per token: False joins the word before when merged
        "causal": analysis.causal,
        "kind": analysis.kind,
        "undefined": {m: why for m, why in analysis.undefined.items() if m in names},
        "weights": pack_weights(item.attn.numpy()),
        "unit": WEIGHT_UNIT,
        "roles": roles,
        "sources": SOURCE_NAMES,
        "probe": str(analysis.probe) if analysis.probe else None,
        "metric_names": names,
        "metrics": {
            m: analysis.metrics[m].round(decimals=4).tolist()
            for m in names
            if m in analysis.metrics
        },
        "role_metric": {
            r.role: r.metric if r.metric in names else (r.fallback or r.metric) for r in RULES
        },
        "open": list(opening_head(analysis, open_head)),
    }


def render_html(data: dict) -> str:
    """The report's HTML fragment (its style, a div and its scripts), embeddable in any page."""
    i = data["id"]
    payload = script_json(data)
    title = html.escape(data["title"])
    notes = "".join(f'<p class="mh-note">{html.escape(n)}</p>' for n in data["notes"])
    return f"""<style>{asset("report.css")}</style>
<div class="mh-report" id="{i}">
<h2 title="{title}">{title}</h2>
{notes}<div class="mh-bar">
  <label><input type="checkbox" id="{i}-special"> hide special tokens (rows renormalised)</label>
  <label><input type="checkbox" id="{i}-merge"> merge word pieces into words</label>
  <span class="mh-legend" id="{i}-legend"></span>
</div>
<div class="mh-main">
  <div class="mh-left"><div class="mh-grid" id="{i}-grid"></div>
    <p class="mh-hint">Click a head: its heatmap and line view open on the right.</p></div>
  <div class="mh-detail">
    <h3 id="{i}-title">Loading the report…</h3>
    <div class="mh-heatbox" id="{i}-heatbox"></div>
    <div class="mh-scale" id="{i}-scale"></div>
    <div class="mh-linebox"><svg id="{i}-lines"></svg></div>
  </div>
</div>
<div class="mh-bar"><b>Metrics</b> <select id="{i}-role"></select>
  <span>click a column header to sort</span></div>
<div class="mh-scroll"><table id="{i}-table"></table></div>
<div class="mh-tip" id="{i}-tip"></div>
</div>
<script>{asset("common.js")}</script>
<script>{asset("report.js")}</script>
<script>MultiheadReport.render({payload});</script>"""


# The page may run only its own inline code and may fetch nothing.
CSP = (
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
    "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">"
)


class HTMLReport:
    """An interactive report of one text's attention. In Jupyter it displays itself inline;
    `save(path)` writes a standalone page."""

    def __init__(
        self, analysis: Analysis, *, title: str = "", open_head=None, text_index: int = 0
    ) -> None:
        self.title = title
        self.data = report_data(analysis, text_index=text_index, title=title, open_head=open_head)

    def fragment(self) -> str:
        return render_html(self.data)

    def _repr_html_(self) -> str:
        return self.fragment()

    def page(self) -> str:
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
{CSP}
<title>{html.escape(self.title or "multihead attention report")}</title></head>
<body>
{self.fragment()}
</body></html>
"""

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, self.page())  # whole or not at all


def write_html(analysis: Analysis, path, *, title: str = "", open_head=None) -> None:
    HTMLReport(analysis, title=title, open_head=open_head).save(path)
