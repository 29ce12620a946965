"""Direct logit attribution: how much each head's output (`hook_result`), and each other
component of the final residual stream, adds to the logit of a target token (or to the
difference of a target's and another token's logits) through the final norm and the unembedding.

    dla = direct_logit_attribution(model, ids, targets)      # targets (B, T) or (B,)
    dla.heads[layer, head]     # (B, T): each head's direct effect at each position
    print(dla.table())         # the heads with the largest effect at the last position

The final residual stream of a pre-norm CausalLM is a sum: token (and position) embeddings,
then per block each head's result, the output projection's bias and the MLP's output. The final
norm is not linear, so, as TransformerLens does (`apply_ln_to_stack`), its scale is frozen: the
per-token scale sqrt(var(x) + eps) (RMSNorm: sqrt(mean(x^2) + eps)) of the real final stream x
divides every component, each centred first for LayerNorm; the norm's weight is applied and its
bias is a component of its own. With the scale of this input frozen, the components sum to the
model's logit (difference) exactly up to rounding; what they do not tell is how the scale would
change if a component were removed (that is what ablation measures).

Blocks that normalise their attention output before it joins the stream (Gemma 2/3, OLMo 2:
`ln1_post`) have that norm's scale frozen the same way: each head's result and the output bias
are multiplied by its gain and divided by its scale (`ln1_post.hook_scale`), so they still sum
to `hook_attn_out`. Under a final-logit soft-cap (Gemma 2) the components sum to the logit
before the cap, tanh(z / c) * c: `logit` is that z.

Shapes: input_ids (B, T); heads (L, H, B, T); the other components (B, T) or (L, B, T).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..hooked.hooks import act_name, run_with_cache, unwrap
from ..hooked.logit_readout import LogitReadout
from ..modules.lm import CausalLM
from ..modules.norm import RMSNorm
from ..table import format_table


@dataclass(frozen=True)
class Attribution:
    heads: Tensor  # (L, H, B, T) each head's hook_result
    attn_bias: Tensor  # (L, B, T) each output projection's bias
    mlp: Tensor  # (L, B, T) each block's hook_mlp_out
    embed: Tensor  # (B, T) hook_embed
    pos_embed: Tensor | None  # (B, T) hook_pos_embed (learned positions only)
    norm_bias: Tensor  # (B, T) the final norm's bias (zeros for RMSNorm)
    logit: Tensor  # (B, T) the model's logit (difference) that the components sum to

    def total(self) -> Tensor:
        """(B, T): the sum of every component; equals `logit` up to rounding."""
        total = self.heads.sum((0, 1)) + self.attn_bias.sum(0) + self.mlp.sum(0)
        total = total + self.embed + self.norm_bias
        return total if self.pos_embed is None else total + self.pos_embed

    def table(self, *, batch: int = 0, position: int = -1, top: int = 10) -> str:
        """The `top` components by |attribution| at one position, largest first."""
        entries = [
            (f"L{layer} H{head}", float(self.heads[layer, head, batch, position]))
            for layer in range(self.heads.shape[0])
            for head in range(self.heads.shape[1])
        ]
        entries += [
            (f"L{layer} mlp", float(self.mlp[layer, batch, position]))
            for layer in range(self.mlp.shape[0])
        ]
        entries.append(("embed", float(self.embed[batch, position])))
        if self.pos_embed is not None:
            entries.append(("pos_embed", float(self.pos_embed[batch, position])))
        entries.sort(key=lambda e: -abs(e[1]))
        rows = [[name, f"{value:+.3f}"] for name, value in entries[:top]]
        logit = float(self.logit[batch, position])
        return f"logit {logit:+.3f} at position {position}\n" + format_table(
            ["component", "direct effect"], rows
        )

    def __str__(self) -> str:
        return self.table()


def _tokens(name: str, t: Tensor | None, B: int, T: int) -> Tensor | None:
    if t is None:
        return None
    if not isinstance(t, Tensor) or t.dtype in (torch.float16, torch.float32, torch.float64):
        raise TypeError(f"{name} must be a tensor of token ids")
    if t.shape == (B,):
        return t[:, None].expand(B, T)
    if t.shape != (B, T):
        raise ValueError(f"{name} must be (B,) or (B, T) = ({B}, {T}), got {tuple(t.shape)}")
    return t


def logit_readout(lm: nn.Module) -> LogitReadout:
    if isinstance(lm, CausalLM):
        norm = lm.norm_f
        return LogitReadout(
            centred=not isinstance(norm, RMSNorm),
            eps=float(getattr(norm, "eps", 0.0)),
            # the norm's effective gain (Gemma: 1 + w)
            weight=norm.gain() if isinstance(norm, RMSNorm) else getattr(norm, "weight", None),
            bias=getattr(norm, "bias", None),
            unembed=lm.head.weight,
            unembed_bias=None,
            logit_scale=1.0,
            has_pos=lm.pos is not None,
            out_biases=[lm.attention(i).out_proj.bias for i in range(len(lm.layers))],
        )
    readout = getattr(lm, "logit_readout", None)
    if callable(readout):
        return readout()
    raise TypeError(f"direct logit attribution reads a CausalLM, got {type(lm).__name__}")


def _uncapped(lm: CausalLM, x: Tensor) -> Tensor:
    """The logits of the final stream x before the final soft-cap."""
    head = lm.head
    return torch.nn.functional.linear(lm.norm_f(x), head.weight, head.bias)


def direct_logit_attribution(
    model: nn.Module,
    input_ids: Tensor,
    targets: Tensor,
    *,
    against: Tensor | None = None,
    attention_mask: Tensor | None = None,
) -> Attribution:
    """Each component's direct effect on the logit of `targets` (minus that of `against`).

    `targets` / `against`: token ids (B, T), one per position, or (B,), the same at every
    position. The model must run without dropout (eval mode), or the components would not sum
    to the stream. See the module docstring for the frozen final-norm scale.
    """
    lm: Any = unwrap(model)
    read = logit_readout(lm)
    if lm.training and lm.config.dropout > 0:
        raise ValueError("put the model in eval mode: dropout breaks the sum of components")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    target = _tokens("targets", targets, B, T)
    assert target is not None
    other = _tokens("against", against, B, T)
    L = len(lm.layers)
    names = ["hook_embed", act_name("resid_post", L - 1)]
    if read.has_pos:
        names.append("hook_pos_embed")
    post = [getattr(lm.layers[i], "norm1_post", None) for i in range(L)]  # (None: joins as it is)
    for i in range(L):
        names += [act_name("result", i), act_name("mlp_out", i)]
        if post[i] is not None:
            names.append(f"blocks.{i}.ln1_post.hook_scale")
    with torch.no_grad():
        logits, cache = run_with_cache(lm, input_ids, attention_mask=attention_mask, names=names)
        x = cache["resid_post", L - 1]  # (B, T, C) the final stream
        if read.centred:  # LayerNorm: (x - mean) / sqrt(var + eps)
            scale = (x.var(-1, unbiased=False, keepdim=True) + read.eps).sqrt()
        else:  # RMSNorm: x / sqrt(mean(x^2) + eps)
            scale = (x.pow(2).mean(-1, keepdim=True) + read.eps).sqrt()
        w_u = read.unembed  # (V, C)
        unembed = w_u[target]  # (B, T, C)
        if other is not None:
            unembed = unembed - w_u[other]
        unembed = unembed * read.logit_scale
        weight = read.weight
        direction = unembed if weight is None else unembed * weight  # the norm's weight folded in

        def effect(component: Tensor) -> Tensor:
            """(..., B, T, C) -> (..., B, T): centred, divided by the frozen scale, projected."""
            if read.centred:
                component = component - component.mean(-1, keepdim=True)
            return (component / scale * direction).sum(-1)

        def branch(i: int, part: Tensor) -> Tensor:
            """A head's result (or the bias) as it joins the stream: through ln1_post with
            its scale frozen, where the block has one."""
            norm_post = post[i]
            if not isinstance(norm_post, RMSNorm):  # (None: no ln1_post)
                return part
            part = part / cache[f"blocks.{i}.ln1_post.hook_scale"]
            gain = norm_post.gain()
            return part if gain is None else part * gain

        heads = torch.stack([effect(branch(i, cache["result", i].movedim(2, 0))) for i in range(L)])
        biases = []
        for i, bias in enumerate(read.out_biases):
            biases.append(
                effect(branch(i, bias.expand_as(x))) if bias is not None else x.new_zeros(B, T)
            )
        norm_bias = (read.bias * unembed).sum(-1) if read.bias is not None else x.new_zeros(B, T)
        if read.unembed_bias is not None:  # the head's own bias joins the norm's
            b_u = read.unembed_bias[target]
            if other is not None:
                b_u = b_u - read.unembed_bias[other]
            norm_bias = norm_bias + b_u * read.logit_scale
        if isinstance(lm, CausalLM) and lm.config.final_softcap is not None:
            logits = _uncapped(lm, x)  # the logits before the cap
        d = torch.gather(logits, -1, target[..., None])[..., 0]
        if other is not None:
            d = d - torch.gather(logits, -1, other[..., None])[..., 0]
        result = Attribution(
            heads=heads,  # (L, H, B, T)
            attn_bias=torch.stack(biases),
            mlp=torch.stack([effect(cache["mlp_out", i]) for i in range(L)]),
            embed=effect(cache["embed"]),
            pos_embed=effect(cache["pos_embed"]) if read.has_pos else None,
            norm_bias=norm_bias,
            logit=d,
        )
    if read.check_sum:
        total, tolerance = result.total(), 1e-3 * (1.0 + d.abs())
        real = (
            torch.ones_like(d, dtype=torch.bool) if attention_mask is None
            else attention_mask.bool()
        )  # fmt: skip
        if not bool(((total - d).abs() <= tolerance)[real].all()):
            gap = float((total - d).abs()[real].max())
            raise ValueError(
                f"direct logit attribution does not add up on {read.name} (components "
                f"miss the logit by up to {gap:.3g}): the final stream is not embed + heads + "
                "biases + MLPs here (scaled embeddings, post-norms, residual multipliers or "
                "position embeddings outside the hook points)"
            )
    return result
