"""Head roles as measured hypotheses: a head gets a role when a metric passes an explicit
threshold, and the role says the number ("previous-token head: 0.94 of its attention on
token i-1"), never a label from nothing.

Each rule says where its metric was measured: on the user's own text ("text"), or on the
repeated-random-token probe ("probe"), which every text shares, so a probe role describes the
head, not the text."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

SOURCES = ("text", "probe")
SOURCE_NAMES = {"text": "measured on the text", "probe": "measured on repeated random tokens"}


@dataclass(frozen=True)
class RoleRule:
    role: str
    metric: str
    threshold: float
    template: str  # formatted with v (the metric value) and offset
    source: str = "text"  # where the metric is measured: "text" or "probe"


RULES: tuple[RoleRule, ...] = (
    RoleRule("previous-token", "previous", 0.5, "{v:.2f} of its attention on token i-1"),
    RoleRule("next-token", "next", 0.5, "{v:.2f} of its attention on token i+1"),
    RoleRule("self", "self", 0.5, "{v:.2f} of its attention on its own token"),
    RoleRule(
        "positional",
        "positional",
        0.9,
        "strongest key at offset {offset:+d} for {v:.2f} of queries",
    ),
    RoleRule("special-token sink", "special", 0.6, "{v:.2f} of its attention on [CLS]/[SEP]"),
    RoleRule("punctuation", "punctuation", 0.4, "{v:.2f} of its attention on punctuation"),
    RoleRule(
        "duplicate-token",
        "duplicate",
        0.3,
        "{v:.2f} of its attention on the earlier copy of the same token",
        source="probe",
    ),
    RoleRule(
        "induction",
        "induction",
        0.3,
        "{v:.2f} of its attention on the token after the earlier copy",
        source="probe",
    ),
    RoleRule("broad", "entropy_norm", 0.85, "normalised entropy {v:.2f}: spread over the text"),
)


@dataclass(frozen=True)
class HeadRole:
    layer: int
    head: int
    role: str
    value: float
    threshold: float
    description: str
    source: str = "text"

    @property
    def strength(self) -> float:
        """How far past its threshold (1.0 = exactly at it)."""
        return self.value / self.threshold

    def __str__(self) -> str:
        where = " (on repeated random tokens)" if self.source == "probe" else ""
        return f"{self.role} head: {self.description}{where}"


def head_roles(
    metrics: dict[str, Tensor], rules=RULES, *, sources=SOURCES
) -> list[list[list[HeadRole]]]:
    """roles[layer][head]: the rules the head passes, strongest first (empty: no clear role).

    `sources`: which measurements may give roles; leave "text" out when the text was too short
    to measure anything (see `analysis.MIN_CONTENT_TOKENS`)."""
    L, H = metrics["previous"].shape
    out: list[list[list[HeadRole]]] = [[[] for _ in range(H)] for _ in range(L)]
    offsets = metrics.get("positional_offset")
    for rule in rules:
        values = metrics.get(rule.metric)
        if values is None or rule.source not in sources:
            continue
        for layer in range(L):
            for head in range(H):
                v = float(values[layer, head])
                if v >= rule.threshold:
                    offset = int(offsets[layer, head]) if offsets is not None else 0
                    text = rule.template.format(v=v, offset=offset)
                    out[layer][head].append(
                        HeadRole(layer, head, rule.role, v, rule.threshold, text, rule.source)
                    )
    for row in out:
        for roles in row:
            roles.sort(key=lambda r: -r.strength)
    return out


def strongest(
    roles: list[list[list[HeadRole]]], top: int | None = None, *, source: str | None = None
) -> list[HeadRole]:
    """Each head's strongest role (of `source`, if given), most clearly specialised heads first:
    ordered by strength, value / threshold."""
    best = []
    for row in roles:
        for passed in row:
            mine = [r for r in passed if source is None or r.source == source]
            if mine:
                best.append(mine[0])
    best.sort(key=lambda r: -r.strength)
    return best if top is None else best[:top]
