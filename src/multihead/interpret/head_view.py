"""An interactive head view for Jupyter (in the manner of bertviz's head view): the layer x head
grid of one text's attention; hovering a token draws its attention lines; clicking a head shows
its measured roles, its metrics and, when given, its syntax scores.

Plain HTML + JS, every script and style inline (no CDN, no widget library), so it renders the
same in JupyterLab, Notebook 7, VS Code and a saved page. Weights travel as the HTML report's do
(`report_html.pack_weights`: 1e-4 units, deflated, base64).

Size cap: at most `MAX_TOKENS` (128) tokens are shown. `show()` analyses only the first 128
tokens of a longer text (the roles are measured on that part); a given `Analysis` of a longer
text is cut to its first 128 tokens (the attention those query rows paid to later tokens is not
drawn). The view says how many tokens it shows out of how many.

Syntax scores are a plain mapping `{(layer, head): {relation: accuracy}}` (what the `syntax`
tools produce per head), so any source of scores can feed the view.
"""

from __future__ import annotations

import html
import secrets
from collections.abc import Mapping
from pathlib import Path

from .analysis import Analysis
from .report_html import WEIGHT_UNIT, asset, opening_head, pack_weights, script_json

MAX_TOKENS = 128
# Metrics listed in a head's details, when the analysis has them.
DETAIL_METRICS = ("previous", "next", "self", "special", "punctuation", "entropy_norm")

SyntaxScores = Mapping[tuple[int, int], Mapping[str, float]]


def _syntax_rows(syntax: SyntaxScores | None, shape: tuple[int, int]) -> dict[str, dict]:
    """{(layer, head): {relation: accuracy}} -> {"layer,head": {relation: accuracy}}, checked."""
    if syntax is None:
        return {}
    if not isinstance(syntax, Mapping):
        raise TypeError(
            "syntax must be a mapping {(layer, head): {relation: accuracy}}, "
            f"got {type(syntax).__name__}"
        )
    L, H = shape
    rows: dict[str, dict] = {}
    for key, scores in syntax.items():
        if (
            not isinstance(key, tuple)
            or len(key) != 2
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in key)
        ):
            raise TypeError(f"syntax keys must be (layer, head) int pairs, got {key!r}")
        layer, head = key
        if not (0 <= layer < L and 0 <= head < H):
            raise ValueError(f"syntax key {key} is outside the model's {L} layers x {H} heads")
        if not isinstance(scores, Mapping):
            raise TypeError(
                f"syntax[{key}] must map relation -> accuracy, got {type(scores).__name__}"
            )
        rows[f"{layer},{head}"] = {str(rel): round(float(acc), 4) for rel, acc in scores.items()}
    return rows


def _check_max_tokens(max_tokens: object) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")


def head_view_data(
    analysis: Analysis,
    *,
    text_index: int = 0,
    syntax: SyntaxScores | None = None,
    max_tokens: int = MAX_TOKENS,
    open_head=None,
) -> dict:
    """What head_view.js draws: tokens, packed weights (L, H, T, T) cut to `max_tokens`, roles,
    a few metrics per head and the syntax scores."""
    _check_max_tokens(max_tokens)
    if not 0 <= text_index < len(analysis.texts):
        raise ValueError(
            f"text_index {text_index} is out of range for {len(analysis.texts)} analysed texts"
        )
    item = analysis.texts[text_index]
    L, H = analysis.shape
    T = min(len(item.tokens), max_tokens)
    weights = item.attn[:, :, :T, :T].numpy()  # (L, H, T, T): the first T queries and keys
    notes = list(analysis.notes)
    if len(item.tokens) > T or item.total_tokens > len(item.tokens):
        notes.append(
            f"Showing the first {T} of {item.total_tokens} tokens (the view's cap is "
            f"{max_tokens}); attention to later tokens is not drawn."
        )
    # a metric a causal pattern does not define (next-token mass) is listed as "n/a"
    metric_names = [m for m in DETAIL_METRICS if m in analysis.metrics or m in analysis.undefined]
    return {
        "id": "mhv-" + secrets.token_hex(4),
        "L": L,
        "H": H,
        "tokens": item.tokens[:T],
        "causal": analysis.causal,
        "kind": analysis.kind,
        "notes": notes,
        "weights": pack_weights(weights),
        "unit": WEIGHT_UNIT,
        "roles": [
            [
                [
                    {"role": r.role, "text": r.description, "strength": round(r.strength, 2)}
                    for r in head
                ]
                for head in analysis.roles[layer]
            ]
            for layer in range(L)
        ],
        "metric_names": metric_names,
        "metrics": {
            m: analysis.metrics[m].round(decimals=4).tolist()
            for m in metric_names
            if m in analysis.metrics
        },
        "undefined": {m: why for m, why in analysis.undefined.items() if m in metric_names},
        "syntax": _syntax_rows(syntax, (L, H)),
        "open": list(opening_head(analysis, open_head)),
    }


def render_head_view(data: dict) -> str:
    """The view's HTML fragment: style, container and scripts, embeddable in any page."""
    i = data["id"]
    payload = script_json(data)
    notes = "".join(f'<p class="mhv-note">{html.escape(n)}</p>' for n in data["notes"])
    return f"""<style>{asset("head_view.css")}</style>
<div class="mhv" id="{i}">
{notes}<div class="mhv-main">
  <div class="mhv-gridbox"><div class="mhv-grid" id="{i}-grid"></div>
    <p class="mhv-hint">Rows: layers, columns: heads. Click a head to select it.</p></div>
  <div class="mhv-tokens"><svg id="{i}-svg"></svg>
    <p class="mhv-hint">Hover a token on the left (a query) to draw its attention lines.</p></div>
  <div class="mhv-details" id="{i}-details"></div>
</div>
</div>
<script>{asset("common.js")}</script>
<script>{asset("head_view.js")}</script>
<script>MultiheadHeadView.render({payload});</script>"""


class HeadView:
    """An interactive head view of one analysed text. Displays itself in Jupyter
    (`_repr_html_`); `save(path)` writes a standalone page."""

    def __init__(
        self,
        analysis: Analysis,
        *,
        syntax: SyntaxScores | None = None,
        max_tokens: int = MAX_TOKENS,
        text_index: int = 0,
        open_head=None,
    ) -> None:
        self.data = head_view_data(
            analysis,
            text_index=text_index,
            syntax=syntax,
            max_tokens=max_tokens,
            open_head=open_head,
        )

    def _repr_html_(self) -> str:
        return render_head_view(self.data)

    def page(self) -> str:
        from .report_html import CSP

        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f"{CSP}\n<title>multihead head view</title></head>\n<body>\n"
            f"{self._repr_html_()}\n</body></html>\n"
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.page(), encoding="utf-8")


def show(
    model,
    text: str,
    *,
    analysis: Analysis | None = None,
    syntax: SyntaxScores | None = None,
    max_tokens: int = MAX_TOKENS,
    probe: bool = True,
) -> HeadView:
    """The head view of `text` on `model` (a `SentenceEncoder`, or any subject `analyze` takes:
    `interpret.subject.EncoderSubject`, `CausalLMSubject`, `load_subject(path)`).

    `analysis`: an `Analysis` of `[text]` already computed (skips the model run). Otherwise the
    first `max_tokens` tokens of `text` are analysed (roles measured on them, and on the
    repeated-token probe unless `probe=False`). `syntax`: per-head syntax scores
    `{(layer, head): {relation: accuracy}}`, shown in a head's details.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    _check_max_tokens(max_tokens)
    if analysis is None:
        from .analysis import analyze
        from .subject import as_subject

        subject = as_subject(model)
        limit = min(max_tokens, subject.token_limit())  # the model's own cut, if shorter
        analysis = analyze(subject, [text], max_tokens=limit, probe=probe)
    elif not isinstance(analysis, Analysis):
        raise TypeError(f"analysis must be an Analysis, got {type(analysis).__name__}")
    return HeadView(analysis, syntax=syntax, max_tokens=max_tokens)
