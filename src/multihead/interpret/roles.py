"""Head roles as measured hypotheses: a head gets a role when a metric passes an explicit
threshold, and the role says the number ("previous-token head: 0.94 of its attention on
token i-1"), never a label from nothing.

Each rule says where its metric was measured: on the user's own text ("text"), or on the
repeated-random-token probe ("probe"), which every text shares, so a probe role describes the
head, not the text.

Where the answer depends on a parameter, the role says which value was measured: previous-token
and induction roles use the best of an offset scan when the metrics hold one ("previous_best" at
"previous_distance", "induction_best" at "induction_offset": a circuit shifted by a position
scheme is still found) and name the offset; a sink role names the sink tokens it measured."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

SOURCES = ("text", "probe")
SOURCE_NAMES = {"text": "measured on the text", "probe": "measured on repeated random tokens"}


@dataclass(frozen=True)
class RoleRule:
    role: str
    metric: str
    threshold: float
    template: str  # formatted with v (the metric value) and the fields of `_fields`
    source: str = "text"  # where the metric is measured: "text" or "probe"
    fallback: str | None = None  # the metric used when `metric` was not measured


RULES: tuple[RoleRule, ...] = (
    RoleRule(
        "previous-token",
        "previous_best",
        0.5,
        "{v:.2f} of its attention on token i-{distance}",
        fallback="previous",
    ),
    RoleRule("next-token", "next", 0.5, "{v:.2f} of its attention on token i+1"),
    RoleRule("self", "self", 0.5, "{v:.2f} of its attention on its own token"),
    RoleRule(
        "positional",
        "positional",
        0.9,
        "strongest key at offset {offset:+d} for {v:.2f} of queries",
    ),
    RoleRule("special-token sink", "special", 0.6, "{v:.2f} of its attention on {sinks}"),
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
        "induction_best",
        0.3,
        "{v:.2f} of its attention on {copy_target}",
        source="probe",
        fallback="induction",
    ),
    RoleRule("broad", "entropy_norm", 0.85, "normalised entropy {v:.2f}: spread over the text"),
)


def with_thresholds(thresholds: dict[str, float], rules=RULES) -> tuple[RoleRule, ...]:
    """`rules` with some thresholds changed, by role name: `with_thresholds({"induction": 0.2})`
    (pass the result as `rules` to `head_roles` or `analysis.analyze`)."""
    known = {r.role for r in rules}
    unknown = sorted(set(thresholds) - known)
    if unknown:
        raise ValueError(f"unknown roles {unknown}; known: {sorted(known)}")
    for role, value in thresholds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"the threshold of {role!r} must be a positive number, got {value!r}")
    return tuple(replace(r, threshold=float(thresholds.get(r.role, r.threshold))) for r in rules)


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


def _fields(metrics: dict[str, Tensor], rule: RoleRule, layer: int, head: int) -> dict:
    """What a role's template may name besides v: the positional offset, the previous-token
    distance and the induction offset that were measured (the defaults when no scan ran)."""

    def at(name: str, default: int) -> int:
        values = metrics.get(name) if rule.metric in metrics else None
        return int(values[layer, head]) if values is not None else default

    copy = at("induction_offset", 1)
    target = (
        "the token after the earlier copy"
        if copy == 1
        else f"the token at offset {copy:+d} from the earlier copy"
    )
    offsets = metrics.get("positional_offset")
    return {
        "offset": int(offsets[layer, head]) if offsets is not None else 0,
        "distance": at("previous_distance", 1),
        "copy_target": target,
    }


def head_roles(
    metrics: dict[str, Tensor], rules=RULES, *, sources=SOURCES, sinks: str = "[CLS]/[SEP]"
) -> list[list[list[HeadRole]]]:
    """roles[layer][head]: the rules the head passes, strongest first (empty: no clear role).

    `sources`: which measurements may give roles; leave "text" out when the text was too short
    to measure anything (see `analysis.MIN_CONTENT_TOKENS`). `sinks`: how a sink role names the
    tokens its "special" mass was measured on."""
    L, H = metrics["previous"].shape
    out: list[list[list[HeadRole]]] = [[[] for _ in range(H)] for _ in range(L)]
    for rule in rules:
        values = metrics.get(rule.metric)
        if values is None and rule.fallback is not None:
            values = metrics.get(rule.fallback)
        if values is None or rule.source not in sources:
            continue
        for layer in range(L):
            for head in range(H):
                v = float(values[layer, head])
                if v >= rule.threshold:
                    fields = _fields(metrics, rule, layer, head)
                    text = rule.template.format(v=v, sinks=sinks, **fields)
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
