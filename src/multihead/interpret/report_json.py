"""`--format json`: tokens, weights and metrics for other tools.

Weights are stored as integers in units of 1e-4 (`weights.unit`): four decimals is what an
attention weight means here, and integers keep a 256-token report near 12 MB where four-decimal
floats take 30 MB. `np.array(data["weights"]["values"]) * data["weights"]["unit"]` gives them
back, shape (layers, heads, query, key). A role's "source" says where it was measured: "text"
(the text itself) or "probe" (repeated random tokens, the same for every text).

"causal": true marks a causal LM's patterns: keys after the query hold 0 because the head
cannot see them (not because it chose not to). Metrics such a pattern does not define are null,
with the reason under "undefined". "sinks" names the tokens the "special" metric measured and
"sink_positions" where they are; "special" marks the special tokens.

"syntax" (null when no spaCy pipeline parsed the text): the text's words with their heads
(1-based, 0 = a sentence's root) and labels as the pipeline gave them, and per relation and
direction the scored pairs ("count"), the best heads' "hits", every head with that many
("heads", [layer, head], the one with most attention on the targets first), the best fixed
offset and its hits, and every head's hits ("per_head", layers x heads); see
`multihead.interpret.syntax.one_text`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from .analysis import Analysis

if TYPE_CHECKING:
    from .syntax.one_text import TextSyntax

WEIGHT_UNIT = 1e-4


def to_json(
    analysis: Analysis, *, text_index: int = 0, model: str = "", syntax: TextSyntax | None = None
) -> str:
    item = analysis.texts[text_index]
    L, H = analysis.shape
    T = len(item.tokens)
    # (L, H, T, T) floats -> integers in units of 1e-4 (rows sum to 10000 up to rounding)
    weights = np.rint(item.attn.double().clamp(0, 1).numpy() / WEIGHT_UNIT).astype(np.int32)
    probe = analysis.probe
    return json.dumps(
        {
            "model": model,
            "text": item.text,
            "tokens": item.tokens,
            "tokens_total": item.total_tokens,
            "truncated": item.truncated,
            "notes": analysis.notes,
            "kind": analysis.kind,
            "causal": analysis.causal,
            "special": item.special,
            "sinks": analysis.sink_label,
            "sink_positions": item.sinks,
            "shape": {"layers": L, "heads": H, "tokens": T},
            "weights": {
                "unit": WEIGHT_UNIT,
                "order": "layer, head, query, key",
                "values": weights.tolist(),
            },
            "metrics": {
                **{
                    k: np.round(v.double().numpy(), 4).tolist() for k, v in analysis.metrics.items()
                },
                **dict.fromkeys(analysis.undefined),
            },
            "undefined": analysis.undefined,
            "probe": None
            if probe is None
            else {"length": probe.length, "trials": probe.trials, "seed": probe.seed},
            "roles": [
                [
                    [
                        {
                            "role": r.role,
                            "value": round(r.value, 4),
                            "threshold": r.threshold,
                            "description": r.description,
                            "source": r.source,
                        }
                        for r in roles
                    ]
                    for roles in row
                ]
                for row in analysis.roles
            ],
            "syntax": None if syntax is None else syntax.to_json(),
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )
