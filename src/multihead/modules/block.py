"""TransformerBlock: attention and feed-forward, each in a residual branch with a norm.

post-norm (BERT):  x = norm1(x + drop(attn(x)));  x = norm2(x + drop(ffn(x)))
pre-norm (GPT-2):  x = x + drop(attn(norm1(x)));  x = x + drop(ffn(norm2(x)))
parallel (GPT-NeoX's use_parallel_residual): x = x + drop(attn(norm1(x))) + drop(ffn(norm2(x)))
  with both branches reading the block's input (hook_resid_mid is then x + attention branch)
`branch_norms` places the norms of a pre-norm block's branches: "pre" (above), "pre+post"
(Gemma 2/3: x = x + norm1_post(attn(norm1(x))), the same around the MLP) or "post" (OLMo 2:
x = x + norm1_post(attn(x)); no norm1 / norm2).
With cross-attention (a decoder layer), a third branch attends to the encoder memory between
the two: norm_cross / cross_attn.

Shapes: x (B, T, C) in and out (or packed sequences (N, C) with `lengths`); memory (B, S, C).

Hook points: hook_resid_pre (what the block receives), hook_attn_out (the attention branch's
output, after dropout), hook_resid_mid (the stream between attention and MLP: after norm1 in a
post-norm block), hook_cross_attn_out and hook_resid_mid_cross (decoder blocks), hook_mlp_out,
hook_resid_post (what the next block receives: after norm2 in a post-norm block).
Children by TransformerLens' names: ln1.* / ln2.* (the norms' hook_scale, hook_normalized;
attributes norm1 / norm2, aliased as ln1 / ln2; the branch-output norms norm1_post / norm2_post
as ln1_post / ln2_post, TransformerLens' Gemma 2 names), mlp.* (hook_pre, hook_post ...;
attribute ffn).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from ..functional.mask_mod import MaskMod
from ..functional.varlen import VarLen
from ..hook_points import ModuleHooks, hooks_for
from ..positional.scheme import PositionScheme
from .attention import MultiHeadAttention
from .cache import CrossKVCache, KVCache, checkpoints, roll_back
from .feedforward import FeedForward, SwiGLU
from .module_call import bare
from .norm import make_norm
from .qk_norm import HeadNorm
from .split_inputs import SPLIT_INPUT_POINTS, split_inputs, wants_split_inputs

BLOCK_HOOK_POINTS = (
    "hook_resid_pre",
    *SPLIT_INPUT_POINTS,  # per-head attention inputs: computed only when hooked
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_out",
    "hook_resid_post",
)
CROSS_HOOK_POINTS = ("hook_cross_attn_out", "hook_resid_mid_cross")


# Forward order of points and children, for hook_names: the norms run before their branch in a
# pre-norm block, after the residual sum in a post-norm one.
PRE_NORM_ORDER = (
    "hook_resid_pre",
    *SPLIT_INPUT_POINTS,
    "norm1",
    "attn",
    "norm1_post",
    "hook_attn_out",
    "hook_resid_mid",
    "norm_cross",
    "cross_attn",
    "hook_cross_attn_out",
    "hook_resid_mid_cross",
    "norm2",
    "ffn",
    "norm2_post",
    "hook_mlp_out",
    "hook_resid_post",
)
POST_NORM_ORDER = (
    "hook_resid_pre",
    *SPLIT_INPUT_POINTS,
    "attn",
    "hook_attn_out",
    "norm1",
    "hook_resid_mid",
    "cross_attn",
    "hook_cross_attn_out",
    "norm_cross",
    "hook_resid_mid_cross",
    "ffn",
    "hook_mlp_out",
    "norm2",
    "hook_resid_post",
)


class TransformerBlock(nn.Module):
    hook_points: tuple[str, ...] = BLOCK_HOOK_POINTS
    _plain_layout = False  # (set per block in __init__: see _plain_forward)
    # TransformerLens' names for the children (blocks.{i}.ln1.hook_scale, blocks.{i}.mlp.hook_post);
    # the attributes, and so the state_dict keys, keep theirs (ln1/ln2/mlp are aliases below).
    hook_alias: ClassVar[dict[str, str]] = {
        "norm1": "ln1",
        "norm2": "ln2",
        "norm_cross": "ln_cross",
        "ffn": "mlp",
        "norm1_post": "ln1_post",
        "norm2_post": "ln2_post",
    }

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        num_kv_heads: int | None = None,
        norm_first: bool = False,
        norm: str = "layernorm",
        norm_eps: float = 1e-5,
        mlp: str = "gelu",
        activation: str | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        causal: bool = False,
        cross_attention: bool = False,
        position: PositionScheme | None = None,
        head_dim: int | None = None,
        qkv_bias: bool | None = None,
        out_bias: bool | None = None,
        mlp_bias: bool | None = None,
        parallel: bool = False,
        branch_norms: str = "pre",
        norm_offset: float = 0.0,
        attn_scale: float | None = None,
        attn_softcap: float | None = None,
        qk_norm: str | None = None,
        device=None,
        dtype=None,
    ) -> None:
        """`mlp`: "gelu" (Linear-GELU-Linear; `activation` names another pointwise function, as
        Hugging Face's hidden_act), "swiglu", "geglu" (gated, `activation` on the gate: gelu
        unless named), or "none" (an attention-only block: no MLP branch,
        as in the small models of Elhage et al. 2021; it has no hook_mlp_out, and hook_resid_post
        equals hook_resid_mid). `norm`: "layernorm" or "rmsnorm".
        `head_dim`: per-head width of self-attention (default dim // num_heads). `qkv_bias`,
        `out_bias`, `mlp_bias`: biases of the q/k/v projection, the attention's output
        projection and the MLP, each defaulting to `bias` (Qwen2: q/k/v only). `parallel`: the
        MLP reads the block's input, not the stream after attention (pre-norm only).
        `mlp="gated"`: the SwiGLU layout with `activation` as its gate (Gemma's GeGLU).
        `branch_norms`: "pre", "pre+post" or "post" (see the module docstring; pre-norm
        blocks only). `norm_offset`: RMSNorm gains are offset + weight (Gemma: 1).
        `attn_scale`, `attn_softcap`: the self-attention's scale and logit soft-cap;
        `qk_norm`: "head" or "width", an RMSNorm of q and k (`modules.qk_norm`)."""
        super().__init__()
        if parallel and not norm_first:
            raise ValueError("parallel attention and MLP branches need norm_first=True")
        factory = {"device": device, "dtype": dtype}
        self.norm_first, self.parallel = norm_first, parallel
        qkv_bias = bias if qkv_bias is None else qkv_bias
        out_bias = bias if out_bias is None else out_bias
        mlp_bias = bias if mlp_bias is None else mlp_bias
        if branch_norms not in ("pre", "pre+post", "post"):
            raise ValueError(f"unknown branch_norms {branch_norms!r}: pre, pre+post or post")
        if branch_norms != "pre" and not norm_first:
            raise ValueError(f"branch_norms={branch_norms!r} needs norm_first=True")

        def new_norm() -> nn.Module:
            return make_norm(norm, dim, norm_eps, norm_offset, **factory)

        q_norm = k_norm = None
        if qk_norm is not None:  # (Qwen3, Gemma 3: per head; OLMo 2: over the width)
            hd = head_dim or dim // num_heads
            q_norm = HeadNorm(qk_norm, num_heads, hd, norm_eps, norm_offset, **factory)
            kv = num_kv_heads or num_heads
            k_norm = HeadNorm(qk_norm, kv, hd, norm_eps, norm_offset, **factory)
        self.attn = MultiHeadAttention(
            dim,
            num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            bias=qkv_bias,
            out_bias=out_bias,
            dropout=attn_dropout,
            causal=causal,
            position=position,
            scale=attn_scale,
            softcap=attn_softcap,
            q_norm=q_norm,
            k_norm=k_norm,
            **factory,
        )
        self.branch_norms = branch_norms
        # (ModernBERT replaces its first layer's norm1 by an Identity: no norm before attention)
        self.norm1: nn.Module | None = new_norm() if branch_norms != "post" else None
        self.norm1_post = new_norm() if branch_norms != "pre" else None
        self.cross_attn: MultiHeadAttention | None = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(
                dim,
                num_heads,
                num_kv_heads=num_kv_heads,
                bias=bias,
                dropout=attn_dropout,
                **factory,
            )
            self.norm_cross = make_norm(norm, dim, norm_eps, **factory)
            self.hook_points = BLOCK_HOOK_POINTS + CROSS_HOOK_POINTS
        self.ffn: nn.Module | None
        if mlp in ("swiglu", "gated", "geglu"):
            # the gated MLP: silu (SwiGLU), `activation` ("gated": Gemma's GeGLU), or gelu
            # unless `activation` names another ("geglu": ModernBERT)
            default = {"swiglu": "silu", "gated": "silu", "geglu": "gelu"}[mlp]
            gate = "silu" if mlp == "swiglu" else activation or default
            self.ffn = SwiGLU(dim, ffn_dim, bias=mlp_bias, activation=gate, **factory)
        elif mlp == "gelu":
            self.ffn = FeedForward(
                dim, ffn_dim, activation_name=activation or "gelu", bias=mlp_bias, **factory
            )
        elif mlp == "none":
            self.ffn = None
        else:
            raise ValueError(
                f"unknown mlp {mlp!r}; choose 'gelu', 'swiglu', 'gated', 'geglu' or 'none'"
            )
        has_ffn = self.ffn is not None
        self.norm2 = new_norm() if has_ffn and branch_norms != "post" else None
        self.norm2_post = new_norm() if has_ffn and branch_norms != "pre" else None
        if self.ffn is None:
            self.hook_points = tuple(p for p in self.hook_points if p != "hook_mlp_out")
        self.dropout = nn.Dropout(dropout)
        self.hook_order = PRE_NORM_ORDER if norm_first else POST_NORM_ORDER
        # (a plain attribute the hot path reads: pre-norm, norms before the branches only, no
        # cross-attention)
        self._plain_layout = norm_first and branch_norms == "pre" and self.cross_attn is None

    # TransformerLens' attribute names, beside ours (not registered twice: state_dict unchanged)
    @property
    def ln1(self) -> nn.Module | None:
        return self.norm1

    @property
    def ln2(self) -> nn.Module | None:
        return self.norm2

    @property
    def mlp(self) -> nn.Module | None:
        return self.ffn

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        cache: KVCache | None = None,
        cross_cache: CrossKVCache | None = None,
        positions: Tensor | None = None,
        return_weights: bool = False,
        lengths: VarLen | Sequence[int] | None = None,
        window: int | tuple[int, int] | None = None,
        documents: Tensor | None = None,
        prefix: int | Tensor | None = None,
        mask_mod: MaskMod | None = None,
        block_size: int | tuple[int, int] | None = None,
    ):
        """x (B, T, C) -> (B, T, C) [, self-attention weights (B, H, T, Tk)].

        With `lengths`, x is packed sequences (N, C) -> (N, C): see `functional.varlen`.
        `window`, `documents`, `prefix`, `mask_mod`, `block_size`: the self-attention's
        structure (see `functional.attention`)."""
        hooks = hooks_for(self)
        if (
            hooks is None
            and self._plain_layout
            and mask is None
            and key_mask is None
            and lengths is None
            and return_weights is False
            and window is None
            and documents is None
            and prefix is None
            and mask_mod is None
            and block_size is None
            and memory is None
            and cross_cache is None
            and _identity(self._modules["dropout"])  # type: ignore[arg-type]
        ):
            return self._plain_forward(x, cache, positions)
        if lengths is not None and self.cross_attn is not None:
            raise ValueError("lengths (packed sequences) do not support cross-attention blocks")
        if hooks is not None:
            x = hooks("hook_resid_pre", x)
        block_input = x  # what the MLP reads in a parallel block
        weights = None
        structure = _given(
            window=window,
            documents=documents,
            prefix=prefix,
            mask_mod=mask_mod,
            block_size=block_size,
        )
        points = checkpoints(cache, cross_cache)  # (each attention undoes its own on failure)
        if hooks is not None and wants_split_inputs(hooks):
            if lengths is not None:
                raise ValueError(
                    "per-head attention inputs (hook_attn_in, hook_q_input ...) need padded "
                    "input (B, T); packed sequences (lengths=) have none"
                )
            with split_inputs(self, x, hooks):  # q, k, v from per-head inputs, handed to attn
                a = self.attn(
                    x, mask=mask, key_mask=key_mask, cache=cache, positions=positions,
                    return_weights=return_weights, **structure,
                )  # fmt: skip
        else:
            a = self.attn(
                self.norm1(x) if self.norm_first and self.norm1 is not None else x,
                mask=mask,
                key_mask=key_mask,
                cache=cache,
                positions=positions,
                return_weights=return_weights,
                lengths=lengths,
                **structure,
            )
        try:  # (self-attention appended to its cache: a failure below undoes that)
            if return_weights:
                a, weights = a
            if self.norm1_post is not None:
                a = self.norm1_post(a)
            x = self._add(x, self.dropout(a), self.norm1, hooks, "hook_attn_out", "hook_resid_mid")
            if self.cross_attn is not None:
                if memory is None and (cross_cache is None or not cross_cache.filled):
                    raise ValueError("this block has cross-attention: pass memory (B, S, C)")
                c = self.cross_attn(
                    self.norm_cross(x) if self.norm_first else x,
                    memory,
                    key_mask=memory_key_mask,
                    cache=cross_cache,
                )
                x = self._add(
                    x,
                    self.dropout(c),
                    self.norm_cross,
                    hooks,
                    "hook_cross_attn_out",
                    "hook_resid_mid_cross",
                )
            if self.ffn is not None:
                h = block_input if self.parallel else x
                m = self.ffn(self.norm2(h) if self.norm_first and self.norm2 is not None else h)
                if self.norm2_post is not None:
                    m = self.norm2_post(m)
                x = self._add(
                    x, self.dropout(m), self.norm2, hooks, "hook_mlp_out", "hook_resid_post"
                )
            elif hooks is not None:  # attention-only: the stream passes on unchanged
                x = hooks("hook_resid_post", x)
        except (ValueError, TypeError):
            roll_back(points)
            raise
        return (x, weights) if return_weights else x

    def _plain_forward(self, x: Tensor, cache: KVCache | None, positions: Tensor | None) -> Tensor:
        """The common call in the fewest Python steps (a decode step runs it once per layer,
        where the general path's bookkeeping cost ~3% of SmolLM2's step): a pre-norm block
        (norms before the branches only) without cross-attention, hooks of its own, mask,
        structure or weights, whose dropout is the identity (eval mode, or p = 0). Children
        are called as modules, or as their forward where `Module.__call__` adds nothing
        (`module_call.bare`), so their hooks (multihead's and torch's) fire as on the general
        path, and the values are the general path's."""
        layers: dict[str, Any] = self._modules
        attn, ffn = layers["attn"], layers.get("ffn")  # (None: not registered)
        points = None if cache is None else checkpoints(cache)
        norm1, norm2 = layers.get("norm1"), layers.get("norm2")
        direct = bare(norm1, attn, norm2, ffn)  # (call their forward: see module_call)

        def call(m: nn.Module) -> Callable[..., Tensor]:
            return m.forward if direct else m

        a = call(attn)(x if norm1 is None else call(norm1)(x), cache=cache, positions=positions)
        if ffn is None:
            return x + a
        try:  # (self-attention appended to its cache: a failure below undoes that)
            h = x if self.parallel else x + a
            m = call(ffn)(h if norm2 is None else call(norm2)(h))
        except (ValueError, TypeError):
            if points is not None:
                roll_back(points)
            raise
        return (x + a) + m if self.parallel else h + m

    def _add(
        self,
        x: Tensor,
        branch: Tensor,
        norm: nn.Module | None,
        hooks: ModuleHooks | None,
        branch_point: str,
        stream_point: str,
    ) -> Tensor:
        """The residual step: x + branch (pre-norm) or norm(x + branch) (post-norm), with the
        branch's and the stream's hook points."""
        if hooks is None:
            return x + branch if self.norm_first else norm(_residual(branch, x))  # type: ignore[misc]
        branch = hooks(branch_point, branch)
        # Out of place: a hook may hold on to `branch` (a cache), so it must not change later.
        x = x + branch if self.norm_first else norm(branch + x)  # type: ignore[misc]
        return hooks(stream_point, x)


def make_blocks(
    config,
    *,
    causal: bool,
    cross_attention: bool = False,
    norm_first: bool | None = None,
    position: Callable[[int], PositionScheme | None] | None = None,
    device=None,
    dtype=None,
) -> nn.ModuleList:
    """`config.num_layers` TransformerBlocks from a model config (StackConfig, LMConfig): the
    fields dim, num_heads, ffn_dim (None: 4 * dim), num_kv_heads, norm, norm_eps, mlp,
    activation, bias, dropout, and norm_first unless given; when the config has them, head_dim,
    qkv_bias, out_bias, mlp_bias, attn_dropout (None: dropout), attention_only (no MLP) and
    parallel_residual.
    `position(layer)` makes each layer's position module (RoPE/ALiBi)."""
    attn_dropout = getattr(config, "attn_dropout", None)
    return nn.ModuleList(
        TransformerBlock(
            config.dim,
            config.num_heads,
            config.ffn_dim or 4 * config.dim,
            num_kv_heads=config.num_kv_heads,
            norm_first=config.norm_first if norm_first is None else norm_first,
            norm=config.norm,
            norm_eps=config.norm_eps,
            mlp="none" if getattr(config, "attention_only", False) else config.mlp,
            activation=config.activation,
            bias=config.bias,
            dropout=config.dropout,
            attn_dropout=config.dropout if attn_dropout is None else attn_dropout,
            causal=causal,
            cross_attention=cross_attention,
            position=position(i) if position is not None else None,
            head_dim=getattr(config, "head_dim", None),
            qkv_bias=getattr(config, "qkv_bias", None),
            out_bias=getattr(config, "out_bias", None),
            mlp_bias=getattr(config, "mlp_bias", None),
            parallel=getattr(config, "parallel_residual", False),
            **_family_options(config),
            device=device,
            dtype=dtype,
        )
        for i in range(config.num_layers)
    )


def _family_options(config) -> dict:
    """The decoder-family data an LMConfig may carry (norm placement and offset, attention
    scale, soft-cap and q/k norm), as block arguments; other configs give none."""
    names = ("branch_norms", "norm_offset", "attn_scale", "attn_softcap", "qk_norm")
    return {n: getattr(config, n) for n in names if hasattr(config, n)}


def _identity(dropout: nn.Module) -> bool:
    """Whether calling the block's dropout changes nothing and shows nothing: eval mode or
    p = 0, and `module_call.bare` (no hooks of its own or global, no instance forward)."""
    return (
        type(dropout) is nn.Dropout
        and (not dropout.training or dropout.p == 0)
        and bare(dropout)  # (nothing watches its call: see module_call)
    )


def _residual(branch: Tensor, x: Tensor) -> Tensor:
    """branch + x; in place into the branch's fresh output when autograd does not need it
    (inference), which saves allocating and page-faulting a new (B, T, C) buffer."""
    if branch.requires_grad or x.requires_grad:
        return branch + x
    return branch.add_(x)


def _given(**structure: object) -> dict[str, object]:
    """The structure arguments that are set (so attention modules that predate them, or hook
    wrappers with the old signature, keep working when none is)."""
    return {name: arg for name, arg in structure.items() if arg is not None}
