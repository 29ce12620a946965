"""`--format json`: tokens, weights and metrics for other tools."""

from __future__ import annotations

import json

from .analysis import Analysis


def to_json(analysis: Analysis, *, text_index: int = 0, model: str = "") -> str:
    item = analysis.texts[text_index]
    L, H = analysis.shape
    return json.dumps(
        {
            "model": model,
            "tokens": item.tokens,
            "shape": {"layers": L, "heads": H, "tokens": len(item.tokens)},
            "weights": item.attn.round(decimals=5).tolist(),  # [layer][head][query][key]
            "metrics": {k: v.round(decimals=5).tolist() for k, v in analysis.metrics.items()},
            "roles": [
                [
                    [
                        {
                            "role": r.role,
                            "value": round(r.value, 4),
                            "threshold": r.threshold,
                            "description": r.description,
                        }
                        for r in roles
                    ]
                    for roles in row
                ]
                for row in analysis.roles
            ],
        },
        ensure_ascii=False,
    )
