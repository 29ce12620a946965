"""`multihead bench patching --attribution`: how well attribution patching ranks what real
patching finds, on two studies of a model that carries its tokenizer (the docs' figures come from
SmolLM2-135M-Instruct's GGUF):

- ioi: 8 prompts "When A and B went to the store, B gave a drink to" against the same with a
  third name C in the second B's place; metric logit(A) - logit(B) at the last position.
- fact: "The Eiffel Tower is in the city of" against "The Colosseum is in the city of"; metric
  the logit of " Paris" at the last position.

For each study: real `patch()` (batched engine) of every head (hook_z), every head's query and
every kv head's key (hook_q, hook_k, all positions at once) and `resid_pre` at every block and
position; then `attribution_patch(..., verify=k)` for each method (plain AtP; AtP with the QK
fix; AtP* = QK fix + GradDrop) and each k. Per kind: Pearson r over all entries (over |values|
for GradDrop, which gives magnitudes), how many of the real top 10 (by |fraction|) are in the
estimate's top 10, the cost in forwards + backwards, and CPU seconds (one thread: see
`bench.patching.clock`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from ..interpret import PatchResult, attribution_patch, patch
from ..models.lm import CausalLM
from ..table import format_table
from .patching import _pearson, _timed

IOI_TEMPLATE = "When{a} and{b} went to the store,{s} gave a drink to"
IOI_NAMES = [  # (A = answer, B = subject, C = the corrupting third name)
    (" Mary", " John", " Tom"), (" John", " Mary", " Anna"), (" Tom", " James", " Paul"),
    (" James", " Tom", " Mark"), (" Anna", " Paul", " Mary"), (" Paul", " Anna", " John"),
    (" Mark", " Sarah", " James"), (" Sarah", " Mark", " Tom"),
]  # fmt: skip
FACT = ("The Eiffel Tower is in the city of", "The Colosseum is in the city of", " Paris")

Study = tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


def _ids(model: CausalLM, text: str) -> torch.Tensor:
    ids = model.to_tokens(text)  # (1, T)
    assert isinstance(ids, torch.Tensor)
    return ids


def ioi(model: CausalLM) -> Study:
    clean = torch.cat([_ids(model, IOI_TEMPLATE.format(a=a, b=b, s=b)) for a, b, _ in IOI_NAMES])
    corrupted = torch.cat(
        [_ids(model, IOI_TEMPLATE.format(a=a, b=b, s=c)) for a, b, c in IOI_NAMES]
    )
    io = torch.tensor([model.to_single_token(a) for a, _, _ in IOI_NAMES])
    s = torch.tensor([model.to_single_token(b) for _, b, _ in IOI_NAMES])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        last = logits[:, -1]  # (B, V)
        return (last.gather(-1, io[:, None]) - last.gather(-1, s[:, None])).mean()

    return clean, corrupted, metric


def fact(model: CausalLM) -> Study:
    clean, corrupted = _ids(model, FACT[0]), _ids(model, FACT[1])
    if clean.shape != corrupted.shape:
        raise ValueError(f"the fact prompts tokenize to {clean.shape} and {corrupted.shape}")
    paris = model.to_single_token(FACT[2])
    return clean, corrupted, lambda logits: logits[:, -1, paris].mean()


def overlap(real: torch.Tensor, estimate: torch.Tensor, k: int = 10) -> int:
    """How many of the real top k (by |value|) are in the estimate's top k."""
    top = set(real.flatten().abs().argsort(descending=True)[:k].tolist())
    return len(top & set(estimate.flatten().abs().argsort(descending=True)[:k].tolist()))


METHODS = (  # (label, attribution_patch arguments)
    ("AtP", {"qk_fix": False}),
    ("AtP+QK fix", {"qk_fix": True}),
    ("AtP*", {"qk_fix": True, "grad_drop": True}),
)
KINDS = ("heads", "q", "k", "resid_pre")


def _grid(result: PatchResult, kind: str) -> torch.Tensor:
    grid = result.heads if kind == "heads" else result.qk.get(kind, result.resid.get(kind))
    assert grid is not None
    return grid


def run(model: CausalLM, name: str, *, verify: Sequence[int] = (0, 10)) -> str:
    if model.tokenizer is None:
        raise ValueError(f"{name} carries no tokenizer: the studies need text")
    blocks = len(model.layers)
    rows = []
    for label, study in (("ioi", ioi), ("fact", fact)):
        clean, corrupted, metric = study(model)
        nodes: dict[str, Any] = {"qk": ("q", "k"), "resid": "resid_pre"}
        real, t_real = _timed(partial(patch, model, clean, corrupted, metric, **nodes))
        for method, options in METHODS:
            magnitudes = bool(options.get("grad_drop"))
            for k in verify:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # the resid warning: measured
                    estimate = partial(attribution_patch, model, clean, corrupted, metric)
                    est, seconds = _timed(partial(estimate, verify=k, **nodes, **options))
                cost = f"2 fwd + {blocks if magnitudes else 1} bwd"
                cost += f" + {len(KINDS) * k} fwd" if k else ""
                for kind in KINDS:
                    want, got = _grid(real, kind), _grid(est, kind)
                    if magnitudes:  # GradDrop gives magnitudes: compare |real| with |estimate|
                        want, got = want.abs(), got.abs()
                    rows.append(
                        [
                            label,
                            method,
                            str(k),
                            kind,
                            f"{_pearson(want, got):.3f}" + ("*" if magnitudes else ""),
                            f"{overlap(want, got)}/10",
                            cost,
                            f"{seconds:.2f}",
                        ]
                    )
        rows.append(
            [label, "real patch()", "", "heads, q, k, resid_pre", "", "", "", f"{t_real:.2f}"]
        )
    table = format_table(
        ["study", "method", "verify", "kind", "r", "top 10", "cost per call", "CPU s"],
        rows,
        left=(0, 1, 3, 6),
    )
    return (
        f"attribution patching vs real patch(): {name}\n{table}\n"
        "AtP: the gradient estimate (q, k linear at hook_q / hook_k); AtP+QK fix: q and k with "
        "the attention pattern recomputed (heads and resid_pre as AtP);\nAtP*: QK fix + GradDrop "
        f"(one backward per block, {blocks} here, mean |estimate|: magnitudes, the sign lost).\n"
        "r: Pearson over all entries (*: of |real| and |estimate|); top 10: of the real top 10 "
        "by |fraction|, how many are in the estimate's top 10;\ncost per call: forwards and "
        "backwards, plus one forward per verified entry of each of the four kinds (one call "
        "asks for all four);\nCPU s: one call (all four kinds), or real patch() of all four"
    )
