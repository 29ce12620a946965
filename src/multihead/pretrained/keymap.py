"""Declarative checkpoint key maps with strict checks.

A rule names one of our parameters and the checkpoint tensors it is made from (several are
concatenated along dim 0, e.g. query/key/value into one packed projection). Loading fails with
one error naming every missing, unexpected or mis-shaped key; nothing is silently left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

LAYER = "{i}"  # placeholder for the layer index in rule keys


@dataclass(frozen=True)
class Rule:
    target: str  # our state_dict key, may contain {i}
    sources: tuple[str, ...]  # checkpoint keys, concatenated along dim 0 when several
    transpose: bool = False  # e.g. GPT-2's Conv1D stores (in, out); nn.Linear wants (out, in)

    @classmethod
    def same(cls, *keys: str) -> list[Rule]:
        """Rules for keys spelt the same in both (e.g. 'x.weight' -> 'x.weight')."""
        return [cls(k, (k,)) for k in keys]


def pair(target_prefix: str, source_prefix: str, *, cat: tuple[str, ...] = ()) -> list[Rule]:
    """Rules for `target_prefix.weight/.bias` from `source_prefix.weight/.bias`; with `cat`, from
    the concatenation of `source_prefix + part` for each part (e.g. '.query', '.key', '.value')."""
    rules = []
    for suffix in ("weight", "bias"):
        if cat:
            sources = tuple(f"{source_prefix}{part}.{suffix}" for part in cat)
        else:
            sources = (f"{source_prefix}.{suffix}",)
        rules.append(Rule(f"{target_prefix}.{suffix}", sources))
    return rules


def convert_state_dict(
    checkpoint: dict[str, Tensor],
    rules: list[Rule],
    *,
    num_layers: int,
    expected: dict[str, torch.Size],
    ignored_prefixes: tuple[str, ...] = (),
) -> dict[str, Tensor]:
    """Build our state_dict from `checkpoint`; ValueError listing every mismatch."""
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    missing: list[str] = []
    for rule in rules:
        indices = range(num_layers) if LAYER in rule.target else [None]
        for i in indices:
            target = rule.target.replace(LAYER, str(i))
            sources = [s.replace(LAYER, str(i)) for s in rule.sources]
            absent = [s for s in sources if s not in checkpoint]
            used.update(s for s in sources if s in checkpoint)  # expected, even if incomplete
            if absent:
                missing.extend(absent)
                continue
            tensors = [checkpoint[s] for s in sources]
            value = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
            out[target] = value.t().contiguous() if rule.transpose and value.dim() == 2 else value
    unexpected = sorted(
        k for k in checkpoint if k not in used and not k.startswith(ignored_prefixes)
    )
    wrong_shape = [
        f"{k}: checkpoint {tuple(v.shape)} != model {tuple(expected[k])}"
        for k, v in out.items()
        if k in expected and v.shape != expected[k]
    ]
    not_filled = sorted(set(expected) - set(out))
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected in the checkpoint: {', '.join(unexpected)}")
    if wrong_shape:
        problems.append(f"shape mismatch: {'; '.join(wrong_shape)}")
    if not_filled and not missing:
        problems.append(f"model parameters without a source: {', '.join(not_filled)}")
    if problems:
        raise ValueError("checkpoint does not match the model: " + " | ".join(problems))
    return out
