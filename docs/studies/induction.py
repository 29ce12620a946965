"""Worked study 1: induction heads in SmolLM2-135M, with multihead's API.

    python docs/studies/induction.py        # prints the tables, writes docs/toolkit-induction.png

Repeated random tokens (a random sequence, then the same sequence again): an induction head
attends from a token in the second half to the token after that token's first occurrence, and
the model predicts the second half almost perfectly. detect_head scores every head against the
induction and previous-token templates in one batched call; zero-ablating the top induction
heads (and, as a control, as many random heads) shows whether they carry the copying.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from common import DOCS, heatmap, load_smollm2
from multihead.interpret import detect_head, run_with_hooks, zero_ablation
from multihead.table import format_table

B, N, TOP = 4, 24, 6


def second_half_loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Next-token loss over the predictions of the repeated half."""
    pred = logits[:, N:-1]  # positions N .. 2N-2 predict tokens N+1 .. 2N-1
    return float(F.cross_entropy(pred.flatten(0, 1), ids[:, N + 1 :].flatten()))


def main() -> None:
    model = load_smollm2()
    L, H = len(model.layers), model.config.num_heads
    g = torch.Generator().manual_seed(0)
    half = torch.randint(1000, 20000, (B, N), generator=g)
    ids = torch.cat([half, half], 1)  # (B, 2N)

    induction = detect_head(model, ids, "induction_head")
    previous = detect_head(model, ids, "previous_token_head")
    order = induction.flatten().argsort(descending=True)
    rows = [
        [f"L{int(i) // H} H{int(i) % H}", f"{float(induction.flatten()[i]):.3f}",
         f"{float(previous.flatten()[i]):.3f}"]
        for i in order[:TOP]
    ]  # fmt: skip
    print(f"detect_head on {B} x {2 * N} repeated random tokens (mul score, TL's definition)")
    print(format_table(["head", "induction", "previous-token"], rows))
    top_prev = previous.flatten().argsort(descending=True)[:3]
    print("top previous-token heads:", ", ".join(
        f"L{int(i) // H} H{int(i) % H} {float(previous.flatten()[i]):.3f}" for i in top_prev
    ))  # fmt: skip

    clean = second_half_loss(model(ids), ids)
    top = [(int(i) // H, int(i) % H) for i in order[:TOP]]
    ablated = second_half_loss(run_with_hooks(model, ids, fwd_hooks=zero_ablation(model, top)), ids)
    rg = torch.Generator().manual_seed(1)
    random_heads = [(int(i) // H, int(i) % H) for i in torch.randperm(L * H, generator=rg)[:TOP]]
    control = run_with_hooks(model, ids, fwd_hooks=zero_ablation(model, random_heads))
    print(format_table(
        ["second-half loss", "nats"],
        [["clean", f"{clean:.3f}"], [f"top {TOP} induction heads zeroed", f"{ablated:.3f}"],
         [f"{TOP} random heads zeroed", f"{second_half_loss(control, ids):.3f}"]],
    ))  # fmt: skip
    path = DOCS / "toolkit-induction.png"
    heatmap(induction, "SmolLM2-135M: induction score (detect_head)", path, label="score")
    print(f"wrote {path.relative_to(DOCS.parent)}")


if __name__ == "__main__":
    main()
