"""One self-contained HTML report: scripts, styles and data inline; no request to any network
address; element ids prefixed per report so several reports can share a page. Weights are
stored as base64 uint16 (T*T*L*H*2 bytes), not JSON float lists."""

from __future__ import annotations

import base64
import html
import json
import secrets
from importlib import resources

import numpy as np

from .analysis import Analysis
from .metrics import SPECIAL_TOKENS
from .roles import RULES

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
)


def _asset(name: str) -> str:
    return (resources.files("multihead.interpret") / "assets" / name).read_text("utf-8")


def report_data(
    analysis: Analysis, *, text_index: int = 0, title: str = "", open_head=None
) -> dict:
    item = analysis.texts[text_index]
    L, H = analysis.shape
    quantised = np.round(item.attn.clamp(0, 1).numpy() * 65535).astype("<u2")
    roles = [
        [
            {"role": r[0].role, "text": r[0].description} if r else None
            for r in analysis.roles[layer]
        ]
        for layer in range(L)
    ]
    names = [m for m in TABLE_METRICS if m in analysis.metrics]
    return {
        "id": "mh-" + secrets.token_hex(4),
        "title": title,
        "L": L,
        "H": H,
        "tokens": item.tokens,
        "special": sorted(SPECIAL_TOKENS),
        "weights": base64.b64encode(quantised.tobytes()).decode("ascii"),
        "roles": roles,
        "metric_names": names,
        "metrics": {m: analysis.metrics[m].round(decimals=4).tolist() for m in names},
        "role_metric": {r.role: r.metric for r in RULES},
        "open": list(open_head) if open_head else None,
    }


def render_html(data: dict) -> str:
    """The report's HTML fragment (a div and its scripts), embeddable in any page."""
    i = data["id"]
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(data["title"])
    return f"""<div class="mh-report" id="{i}">
<h2>{title}</h2>
<div class="mh-bar">
  <label><input type="checkbox" id="{i}-special"> hide special tokens (rows renormalised)</label>
  <label><input type="checkbox" id="{i}-merge"> merge word pieces into words</label>
  <span>Click a head for its heatmap and line view.</span>
</div>
<div class="mh-grid" id="{i}-grid"></div>
<h3 id="{i}-title">Click a head in the grid</h3>
<div class="mh-detail"><canvas id="{i}-heat"></canvas><svg id="{i}-lines"></svg></div>
<div class="mh-bar"><b>Metrics</b> <select id="{i}-role"></select>
  <span>click a column header to sort</span></div>
<div class="mh-scroll"><table id="{i}-table"></table></div>
<div class="mh-tip" id="{i}-tip"></div>
</div>
<script>{_asset("report.js")}</script>
<script>MultiheadReport.render({payload});</script>"""


# The page may run only its own inline code and may fetch nothing.
CSP = (
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
    "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">"
)


def write_html(analysis: Analysis, path, *, title: str = "", open_head=None) -> None:
    data = report_data(analysis, title=title, open_head=open_head)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
{CSP}
<title>{html.escape(title or "multihead attention report")}</title>
<style>{_asset("report.css")}</style></head>
<body>
{render_html(data)}
</body></html>
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
