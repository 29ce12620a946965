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
    # 95% bootstrap interval of the value over texts (or probe trials) when several were
    # measured; the role was then given only because the interval's lower bound cleared the
    # threshold
    ci: tuple[float, float] | None = None

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
    metrics: dict[str, Tensor],
    rules=RULES,
    *,
    sources=SOURCES,
    sinks: str = "[CLS]/[SEP]",
    intervals: dict[str, tuple[Tensor, Tensor]] | None = None,
) -> list[list[list[HeadRole]]]:
    """roles[layer][head]: the rules the head passes, strongest first (empty: no clear role).

    `sources`: which measurements may give roles; leave "text" out when the text was too short
    to measure anything (see `analysis.MIN_CONTENT_TOKENS`). `sinks`: how a sink role names the
    tokens its "special" mass was measured on. `intervals`: metric -> (low, high) (L, H) bounds
    of a 95% interval over texts (see `analysis.Analysis.intervals`); a rule whose metric has
    one passes only where the low bound clears the threshold, and the role carries it."""
    L, H = metrics["previous"].shape
    out: list[list[list[HeadRole]]] = [[[] for _ in range(H)] for _ in range(L)]
    for rule in rules:
        values = metrics.get(rule.metric)
        if values is None and rule.fallback is not None:
            values = metrics.get(rule.fallback)
        if values is None or rule.source not in sources:
            continue
        bounds = (intervals or {}).get(
            rule.metric if rule.metric in metrics else rule.fallback or ""
        )
        for layer in range(L):
            for head in range(H):
                v = float(values[layer, head])
                ci = None
                if bounds is not None:
                    ci = (float(bounds[0][layer, head]), float(bounds[1][layer, head]))
                if (ci[0] if ci else v) >= rule.threshold:
                    fields = _fields(metrics, rule, layer, head)
                    text = rule.template.format(v=v, sinks=sinks, **fields)
                    out[layer][head].append(
                        HeadRole(layer, head, rule.role, v, rule.threshold, text, rule.source, ci)
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


SINK = "special-token sink"


@dataclass(frozen=True)
class RoleTable:
    """What `inspect` prints for one source: one row per kind of role (its strongest head),
    the sinks apart (summarised in one line), then the other heads, strongest first."""

    per_kind: list[HeadRole]
    sinks: list[HeadRole]
    rest: list[HeadRole]

    @property
    def passing(self) -> int:
        return len(self.per_kind) + len(self.sinks) + len(self.rest)


def role_table(roles: list[list[list[HeadRole]]], source: str) -> RoleTable:
    """The heads whose strongest role (of `source`) passed, arranged as `RoleTable`."""
    best = strongest(roles, source=source)
    sinks = [r for r in best if r.role == SINK]
    others = [r for r in best if r.role != SINK]
    per_kind: dict[str, HeadRole] = {}
    for r in others:  # strongest first: the first of each kind is its strongest head
        per_kind.setdefault(r.role, r)
    chosen = set(map(id, per_kind.values()))
    return RoleTable(list(per_kind.values()), sinks, [r for r in others if id(r) not in chosen])


def sink_summary(sinks: list[HeadRole]) -> str:
    """ "18 heads, in layers 2-5 (L2: 3, L3: 5, L4: 6, L5: 4), 0.61-0.98 of their attention"."""
    if not sinks:
        return "none"
    layers: dict[int, int] = {}
    for r in sinks:
        layers[r.layer] = layers.get(r.layer, 0) + 1
    span = sorted(layers)
    where = f"layer {span[0]}" if len(span) == 1 else f"layers {span[0]}-{span[-1]}"
    counts = ", ".join(f"L{layer}: {n}" for layer, n in sorted(layers.items()))
    if len(layers) > 6:  # one line: the layers holding most of them
        top = sorted(layers.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        where = f"{len(layers)} layers, {span[0]}-{span[-1]}"
        counts = "most in " + ", ".join(f"L{layer}: {n}" for layer, n in top)
    low, high = min(r.value for r in sinks), max(r.value for r in sinks)
    n = len(sinks)
    return (
        f"{n} head{'s' * (n != 1)} in {where} ({counts}), {low:.2f}-{high:.2f} of their attention"
    )


def sinks_that_induct(roles: list[list[list[HeadRole]]]) -> list[tuple[int, int]]:
    """Heads that are sinks on the text and induction heads on the probe (a head can rest on
    the sink when there is nothing to copy and copy when there is)."""
    out = []
    for layer, row in enumerate(roles):
        for head, passed in enumerate(row):
            names = {(r.role, r.source) for r in passed}
            if (SINK, "text") in names and ("induction", "probe") in names:
                out.append((layer, head))
    return out
