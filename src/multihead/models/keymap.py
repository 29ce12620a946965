"""Declarative checkpoint key maps, checked against the checkpoint's header before any tensor
is read.

A rule names one of our parameters and the checkpoint tensors it is made from (several are
concatenated along dim 0, e.g. query/key/value into one packed projection; `transpose` turns
GPT-2's Conv1D (in, out) into nn.Linear's (out, in)). `plan_state_dict` matches rules against
the checkpoint's names and shapes and fails with one error naming every missing, unexpected or
mis-shaped key; nothing is silently left out.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER = "{i}"  # placeholder for the layer index in rule keys
Shape = tuple[int, ...]


@dataclass(frozen=True)
class Rule:
    target: str  # our state_dict key, may contain {i}
    sources: tuple[str, ...]  # checkpoint keys, concatenated along dim 0 when several
    transpose: bool = False  # e.g. GPT-2's Conv1D stores (in, out); nn.Linear wants (out, in)

    @classmethod
    def same(cls, *keys: str) -> list[Rule]:
        """Rules for keys spelt the same in both (e.g. 'x.weight' -> 'x.weight')."""
        return [cls(k, (k,)) for k in keys]


def pair(
    target_prefix: str,
    source_prefix: str,
    *,
    cat: tuple[str, ...] = (),
    bias: bool = True,
    transpose: bool = False,
) -> list[Rule]:
    """Rules for `target_prefix.weight` (and `.bias` unless bias=False) from
    `source_prefix.weight/.bias`; with `cat`, from the concatenation of `source_prefix + part`
    for each part (e.g. '.query', '.key', '.value')."""
    rules = []
    for suffix in ("weight", "bias") if bias else ("weight",):
        if cat:
            sources = tuple(f"{source_prefix}{part}.{suffix}" for part in cat)
        else:
            sources = (f"{source_prefix}.{suffix}",)
        rules.append(Rule(f"{target_prefix}.{suffix}", sources, transpose and suffix == "weight"))
    return rules


@dataclass(frozen=True)
class Source:
    """How one of our tensors is made: checkpoint keys (concatenated along dim 0), transposed?"""

    keys: tuple[str, ...]
    transpose: bool
    shape: Shape  # the result's shape


def _result_shape(shapes: list[Shape], transpose: bool) -> Shape | str:
    """Shape after concatenation and transposition, or why there is none."""
    first = shapes[0]
    if any(len(s) != len(first) or s[1:] != first[1:] or not s for s in shapes):
        return f"sources of shapes {', '.join(str(s) for s in shapes)} do not concatenate"
    shape = (sum(s[0] for s in shapes), *first[1:]) if len(shapes) > 1 else first
    return shape[::-1] if transpose and len(shape) == 2 else shape


def plan_state_dict(
    shapes: dict[str, Shape],
    rules: list[Rule],
    *,
    num_layers: int,
    expected: dict[str, Shape],
    ignored: tuple[str, ...] = (),
    spelling: dict[str, str] | None = None,
) -> dict[str, Source]:
    """Our state_dict key -> its Source, from the checkpoint's names and shapes alone.

    `expected`: our keys and shapes. `ignored`: checkpoint keys that are not ours to load,
    matched as prefixes or, when starting with '.', as suffixes. `spelling`: the checkpoint's
    own name of each key (when the family renamed them), for messages. ValueError naming every
    mismatch.
    """
    spell = spelling or {}
    plan: dict[str, Source] = {}
    used: set[str] = set()
    missing: list[str] = []
    wrong_shape: list[str] = []
    for rule in rules:
        for i in range(num_layers) if LAYER in rule.target else [None]:
            target = rule.target.replace(LAYER, str(i))
            sources = tuple(s.replace(LAYER, str(i)) for s in rule.sources)
            used.update(s for s in sources if s in shapes)  # expected, even if incomplete
            absent = [s for s in sources if s not in shapes]
            if absent:
                missing.extend(absent)
                continue
            shape = _result_shape([shapes[s] for s in sources], rule.transpose)
            if isinstance(shape, str):
                wrong_shape.append(f"{target}: {shape}")
                continue
            if target in expected and shape != tuple(expected[target]):
                wrong_shape.append(
                    f"{target}: checkpoint {shape} != model {tuple(expected[target])}"
                )
            plan[target] = Source(sources, rule.transpose, shape)
    prefixes = tuple(p for p in ignored if not p.startswith("."))
    suffixes = tuple(p for p in ignored if p.startswith("."))
    unexpected = sorted(
        spell.get(k, k)
        for k in shapes
        if k not in used and not k.startswith(prefixes) and not k.endswith(suffixes)
    )
    not_filled = sorted(set(expected) - set(plan))
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected in the checkpoint: {', '.join(unexpected)}")
    if wrong_shape:
        problems.append(f"shape mismatch: {'; '.join(wrong_shape)}")
    if not_filled and not missing and not wrong_shape:
        problems.append(f"model parameters without a source: {', '.join(not_filled)}")
    if problems:
        raise ValueError("checkpoint does not match the model: " + " | ".join(problems))
    return plan
