"""Worked study 2: indirect object identification (Wang et al. 2022) in SmolLM2-135M, with
multihead's API: direct logit attribution through the cache algebra, activation patching of
every head (the batched engine) and attribution patching beside it.

    python docs/studies/ioi.py    # prints the tables, writes docs/toolkit-ioi-*.png

Prompts "When A and B went to the store, B gave a drink to" should end in " A" (the indirect
object), not " B" (the subject, named twice). The metric is the logit difference
logit(A) - logit(B) at the last position, averaged over the prompts. The corrupted prompts
name a third person C in place of the second B ("ABC"), which removes the duplication the IOI
circuit reads, while every position stays aligned.
"""

from __future__ import annotations

import time

import torch

from common import DOCS, heatmap, load_smollm2
from multihead.interpret import attribution_patch, patch, run_with_cache
from multihead.table import format_table

TEMPLATE = "When{a} and{b} went to the store,{s} gave a drink to"
TRIPLES = [  # (A = answer, B = subject, C = the corrupting third name)
    (" Mary", " John", " Tom"), (" John", " Mary", " Anna"), (" Tom", " James", " Paul"),
    (" James", " Tom", " Mark"), (" Anna", " Paul", " Mary"), (" Paul", " Anna", " John"),
    (" Mark", " Sarah", " James"), (" Sarah", " Mark", " Tom"),
]  # fmt: skip
TOP = 8


def main() -> None:
    model = load_smollm2()
    L, H = len(model.layers), model.config.num_heads
    clean = torch.cat([model.to_tokens(TEMPLATE.format(a=a, b=b, s=b)) for a, b, _ in TRIPLES])
    corrupted = torch.cat(
        [model.to_tokens(TEMPLATE.format(a=a, b=b, s=c)) for a, b, c in TRIPLES]
    )
    io = torch.tensor([model.to_single_token(a) for a, _, _ in TRIPLES])
    s = torch.tensor([model.to_single_token(b) for _, b, _ in TRIPLES])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        last = logits[:, -1]  # (B, V)
        return (last.gather(-1, io[:, None]) - last.gather(-1, s[:, None])).mean()

    logits, cache = run_with_cache(model, clean)
    print(f"{len(TRIPLES)} prompts of {clean.shape[1]} tokens; logit difference IO - S: "
          f"clean {float(metric(logits)):.3f}, corrupted {float(metric(model(corrupted))):.3f}")  # fmt: skip

    # Direct logit attribution: each head's output at the last position, through the frozen
    # final norm, along W_U[IO] - W_U[S]; the full decomposition sums to the logit difference.
    heads = cache.stack_head_results(pos_slice=-1)  # (L*H, B, C)
    dla = cache.logit_attrs(heads, io, s, pos_slice=-1).mean(-1).reshape(L, H)
    full = cache.get_full_resid_decomposition(pos_slice=-1)
    total = float(cache.logit_attrs(full, io, s, pos_slice=-1).sum(0).mean())
    print(f"the full decomposition's attributions sum to {total:.4f} (the final norm has no "
          f"bias, so this is the logit difference {float(metric(logits)):.4f})")  # fmt: skip
    order = dla.flatten().abs().argsort(descending=True)[:TOP]
    print(format_table(
        ["head", "direct effect on IO - S"],
        [[f"L{int(i) // H} H{int(i) % H}", f"{float(dla.flatten()[i]):+.3f}"] for i in order],
    ))  # fmt: skip

    start = time.perf_counter()
    real = patch(model, clean, corrupted, metric, heads=True)
    t_patch = time.perf_counter() - start
    start = time.perf_counter()
    approx = attribution_patch(model, clean, corrupted, metric, heads=True)
    t_attr = time.perf_counter() - start
    assert real.heads is not None and approx.heads is not None
    print(f"patch(heads=True), batched engine: {L * H} patches in {t_patch:.1f} s; "
          f"attribution_patch: {t_attr:.1f} s")  # fmt: skip
    print(real.table(top=TOP, kind="heads"))
    r = torch.corrcoef(torch.stack([real.heads.flatten(), approx.heads.flatten()]))[0, 1]
    top = real.heads.flatten().abs().argsort(descending=True)[:20]
    r_top = torch.corrcoef(torch.stack([real.heads.flatten()[top], approx.heads.flatten()[top]]))[0, 1]
    print(f"attribution vs real patching: Pearson r = {float(r):.3f} over all {L * H} heads, "
          f"{float(r_top):.3f} over the top 20 by |real|")  # fmt: skip

    heatmap(dla, "SmolLM2-135M IOI: direct logit attribution", DOCS / "toolkit-ioi-dla.png",
            label="logit difference")  # fmt: skip
    heatmap(real.heads, "SmolLM2-135M IOI: patching each head (ABC)",
            DOCS / "toolkit-ioi-patching.png", label="fraction recovered")  # fmt: skip
    _scatter(real.heads.flatten(), approx.heads.flatten(), DOCS / "toolkit-ioi-attribution.png")
    print("wrote docs/toolkit-ioi-dla.png, docs/toolkit-ioi-patching.png, "
          "docs/toolkit-ioi-attribution.png")  # fmt: skip


def _scatter(real: torch.Tensor, approx: torch.Tensor, path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 4))
    ax.scatter(real, approx, s=8)
    limit = float(torch.cat([real, approx]).abs().max())
    ax.plot([-limit, limit], [-limit, limit], lw=0.5, color="grey")
    ax.set_xlabel("patching (fraction recovered)")
    ax.set_ylabel("attribution patching (estimate)")
    ax.set_title("SmolLM2-135M IOI: every head", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
