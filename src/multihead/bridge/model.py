"""`wrap(model)`: a transformers model with multihead's attention inside and multihead's hook
points on it, as a `BridgedModel` (an `nn.Module` wrapping it).

The transformers model is changed in place (its attention implementation becomes "multihead",
its modules get hook-point attributes and forward hooks that cost a ContextVar read when nothing
observes them) and is held as `bridged.hf`: its parameters, state_dict (keys under "hf."),
`.to()`, `.train()` are the wrapper's. A model is wrapped once: a second wrap is refused.

Hook names are the native ones (see `multihead.interpret.hooks`): `hook_embed`,
`blocks.{i}.hook_resid_pre`, `blocks.{i}.attn.hook_q` ... `hook_z`, `hook_result`,
`blocks.{i}.hook_attn_out`, `hook_resid_mid`, `hook_mlp_out`, `hook_resid_post`, `hook_logits`
(encoder-decoders: `encoder.blocks.{i}.*`, `decoder.blocks.{i}.*`, and `cross_attn.*`,
`hook_cross_attn_out`, `hook_resid_mid_cross` on decoder blocks). docs/bridge.md says what each
means on a bridged model.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..hook_points import hooks_for
from ..modules.attend import ATTENTION_HOOK_POINTS, head_results
from .attention import NAME, register
from .discover import BridgeError, LayerParts, Stack, discover, final_norm

MARK = "_multihead_bridged"
# id(layer) -> the shape of the stream it received in the running forward (recorded only while
# hooks observe the layer), for the tensors of an MLP that runs on flattened tokens
_SHAPES: ContextVar[dict[int, tuple[int, ...]] | None] = ContextVar(
    "multihead_bridge_shapes", default=None
)
# transformers' own defaults, which the bridge replaces; any other choice is the user's
REPLACEABLE = (None, "eager", "sdpa")


@dataclass(frozen=True)
class BridgeConfig:
    """The sizes the interpret toolkit reads from a model's `config` (as `LMConfig` has them)."""

    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    dim: int
    vocab_size: int
    max_positions: int
    dropout: float
    causal: bool


def _first(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else out[0]


def _with_first(out: Any, x: Tensor) -> Any:
    if isinstance(out, Tensor):
        return x
    return (x, *out[1:]) if isinstance(out, tuple) else out.__class__(x, *out[1:])


def _stream_view(owner: nn.Module, x: Tensor) -> Tensor:
    """A layer's (B * T, C) tensor as (B, T, C) (OPT runs its MLP on flattened tokens), from
    the shape its layer received in this forward; other tensors as they are."""
    shape = (_SHAPES.get() or {}).get(id(owner))
    if x.dim() == 2 and shape is not None and len(shape) == 3:
        return x.view(shape[0], shape[1], x.shape[-1])
    return x


def _show(owner: nn.Module, point: str, out: Any) -> Any:
    """A forward hook's body: show the output's first tensor at `owner`'s `point`."""
    hooks = hooks_for(owner)
    if hooks is None or point not in hooks:
        return None
    x = _first(out)
    seen = _stream_view(owner, x)
    y = hooks(point, seen)
    return None if y is seen else _with_first(out, y.reshape(x.shape))


def _read_only(owner: nn.Module, point: str, x: Tensor) -> None:
    hooks = hooks_for(owner)
    if hooks is None or point not in hooks:
        return
    seen = _stream_view(owner, x)
    if hooks(point, seen) is not seen:
        raise ValueError(
            f"{hooks.name}.{point} of a bridged model can be read, not replaced: transformers' "
            "layer keeps its own copy of the residual stream there. Replace hook_attn_out, or "
            "the next block's hook_resid_pre, instead"
        )


class BridgedModel(nn.Module):
    """A transformers model run through multihead's attention, with multihead's hook points.

    `bridged(input_ids, attention_mask=None, last_only=False, **kwargs)` -> logits (B, T, V)
    (`last_only`: (B, 1, V)); text is tokenised by the tokenizer it carries. Other keywords
    go to the transformers model (an encoder-decoder needs `decoder_input_ids`).
    """

    hook_points: tuple[str, ...] = ("hook_embed", "hook_logits")
    hook_alias: ClassVar[dict[str, str]] = {"hf": ""}
    hook_order = ("hook_embed", "hf", "hook_logits")

    def __init__(self, hf: Any, stacks: list[Stack], tokenizer: Any = None) -> None:
        super().__init__()
        self.hf: Any = hf  # a transformers PreTrainedModel
        self.tokenizer = tokenizer
        self._stacks = stacks
        text = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
        heads = int(text.num_attention_heads)
        self.config = BridgeConfig(
            model_type=str(getattr(text, "model_type", type(hf).__name__)),
            num_layers=len(stacks[-1].layers),
            num_heads=heads,
            num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            dim=int(text.hidden_size),
            vocab_size=int(text.vocab_size),
            max_positions=int(getattr(text, "max_position_embeddings", None) or 512),
            dropout=float(getattr(text, "attention_dropout", 0.0) or 0.0),
            causal=not bool(getattr(hf.config, "is_encoder_decoder", False)),
        )
        self.is_encoder_decoder = bool(getattr(hf.config, "is_encoder_decoder", False))

    # -- the protocol the interpret toolkit reads -------------------------------------------

    @property
    def layers(self) -> nn.ModuleList:
        """The (last) stack's layers: a decoder's blocks (hook names blocks.{i})."""
        layers = self.hf.get_submodule(self._stacks[-1].path)
        assert isinstance(layers, nn.ModuleList)  # as discover found it
        return layers

    @property
    def norm_f(self) -> nn.Module | None:
        """The final norm of a decoder-only model (None for an encoder-decoder)."""
        return None if self.is_encoder_decoder else final_norm(self.hf, self._stacks[-1].path)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.layers

    def attention(self, layer: int) -> nn.Module:
        return self._stacks[-1].layers[layer].attn

    def logits(self, h: Tensor) -> Tensor:
        """(..., C) final-normed stream -> (..., V), as the model's own head computes them
        (its output embedding, then any logit scale or soft-cap its config names)."""
        config = self.hf.config
        logits = self.hf.get_output_embeddings()(h)
        if getattr(config, "logit_scale", None) is not None:  # Cohere
            logits = logits * config.logit_scale
        if getattr(config, "logits_scaling", None) is not None:  # Granite
            logits = logits / config.logits_scaling
        cap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 / 3
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def logit_readout(self) -> Any:
        """The final norm and head as direct logit attribution reads them
        (`interpret.attribution.LogitReadout`). The norm's kind, effective weight and bias are
        measured by probing it (Gemma's (1 + w) included); its eps is read from the module.
        DLA then checks that the components add up to the logit (`check_sum`)."""
        from ..interpret.attribution import LogitReadout

        norm = self.norm_f
        name = type(self.hf).__name__
        if norm is None:
            raise TypeError(f"direct logit attribution reads a causal LM, not {name}")
        if getattr(self.hf.config, "final_logit_softcapping", None) is not None:
            raise ValueError(
                f"direct logit attribution: {name}'s final logit soft-cap is not linear"
            )
        eps = next(
            (getattr(norm, a) for a in ("eps", "variance_epsilon", "epsilon") if hasattr(norm, a)),
            None,
        )
        if not isinstance(eps, (int, float)):
            raise ValueError(
                f"direct logit attribution: {name}'s final norm ({type(norm).__name__}) shows no "
                "eps attribute, so its scale cannot be frozen"
            )
        p = next(self.parameters())
        C = self.config.dim
        x = torch.ones(C, device=p.device, dtype=torch.float32)
        x[1::2] = -1.0
        if C % 2:  # an odd width: mean 0 and mean square 1 still
            x = x - x.mean()
            x = x / x.pow(2).mean().sqrt()
        with torch.no_grad():
            up, down = norm(x.to(p.dtype)).float(), norm((-x).to(p.dtype)).float()
            shifted = norm((x + 3.0).to(p.dtype)).float()
        centred = bool(torch.allclose(shifted, up, atol=1e-4, rtol=1e-4))
        # for a centred x of mean square 1: norm(+-x) = +-x / sqrt(1 + eps) * w + b
        weight = (up - down) / 2 / x * (1.0 + eps) ** 0.5
        bias = (up + down) / 2
        head = self.hf.get_output_embeddings()
        config = self.hf.config
        scale = 1.0
        if getattr(config, "logit_scale", None) is not None:
            scale *= float(config.logit_scale)
        if getattr(config, "logits_scaling", None) is not None:
            scale /= float(config.logits_scaling)
        return LogitReadout(
            centred=centred,
            eps=float(eps),
            weight=weight.to(p.dtype),
            bias=bias.to(p.dtype) if bool(bias.abs().max() > 0) else None,
            unembed=head.weight,
            unembed_bias=getattr(head, "bias", None),
            logit_scale=scale,
            has_pos=False,
            out_biases=[
                parts.out_proj.bias if parts.out_proj is not None else None
                for parts in self._stacks[-1].layers
            ],
            check_sum=True,
            name=name,
        )

    # -- running ----------------------------------------------------------------------------

    def forward(
        self,
        input_ids: Any = None,
        attention_mask: Tensor | None = None,
        *,
        last_only: bool = False,
        **kwargs: Any,
    ) -> Tensor:
        if _is_text(input_ids):
            input_ids, mask = self.to_tokens(input_ids, return_mask=True)
            attention_mask = attention_mask if attention_mask is not None else mask
        if last_only and not self.is_encoder_decoder:
            kwargs["logits_to_keep"] = 1
        kwargs.setdefault("use_cache", False)
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits = out.logits
        hooks = hooks_for(self)
        if hooks is not None:
            logits = hooks("hook_logits", logits)
        return logits

    # -- text -------------------------------------------------------------------------------

    def _tok(self, what: str) -> Any:
        if self.tokenizer is None:
            raise ValueError(
                f"{what} needs a tokenizer, and this bridged model carries none: pass "
                "tokenizer= to multihead.wrap, or load a directory with one"
            )
        return self.tokenizer

    def to_tokens(
        self,
        input: str | Sequence[str],
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        *,
        return_mask: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """(B, T) ids of a text or a list of texts, padded on `padding_side` (default right).
        `prepend_bos`: None = the tokenizer's own special tokens; False = none."""
        tok = self._tok("to_tokens")
        texts = [input] if isinstance(input, str) else list(input)
        if not _is_text(texts):
            raise TypeError(f"input must be a str or a list of str, got {type(input).__name__}")
        rows = [tok(t, add_special_tokens=prepend_bos is not False)["input_ids"] for t in texts]
        if prepend_bos and tok.bos_token_id is not None:
            rows = [r if r[:1] == [tok.bos_token_id] else [tok.bos_token_id, *r] for r in rows]
        T = max(len(r) for r in rows)
        pad = next((i for i in (tok.pad_token_id, tok.eos_token_id) if i is not None), 0)
        ids = torch.full((len(rows), T), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for b, row in enumerate(rows):
            cols = slice(T - len(row), T) if padding_side == "left" else slice(0, len(row))
            ids[b, cols] = torch.tensor(row, dtype=torch.long)
            mask[b, cols] = 1
        device = next(self.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        return (ids, mask) if return_mask else ids

    def to_str_tokens(self, input: Any) -> list[str]:
        """Each token of a text (or of a (T,) / (1, T) id tensor) as the text it stands for."""
        tok = self._tok("to_str_tokens")
        ids = self.to_tokens(input)[0] if isinstance(input, str) else input
        if isinstance(ids, Tensor):
            ids = ids.reshape(-1).tolist()
        return [tok.decode([i]) for i in ids]

    def to_string(self, tokens: Any) -> str | list[str]:
        tok = self._tok("to_string")
        if isinstance(tokens, Tensor) and tokens.dim() == 2:
            return [tok.decode(row) for row in tokens.tolist()]
        return tok.decode(tokens.tolist() if isinstance(tokens, Tensor) else tokens)

    def generate(self, input: Any, max_new_tokens: int = 20, **kwargs: Any) -> Any:
        """Greedy unless told otherwise (`do_sample=True`), through transformers' generate:
        text in -> the prompt plus the new text out (a list for a list); ids in -> ids out."""
        kwargs.setdefault("do_sample", False)
        if _is_text(input):
            tok = self._tok("generate")
            ids, mask = self.to_tokens(input, padding_side="left", return_mask=True)
            out = self.hf.generate(
                ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id or tok.eos_token_id, **kwargs,
            )  # fmt: skip
            texts = [tok.decode(row, skip_special_tokens=True) for row in out.tolist()]
            return texts[0] if isinstance(input, str) else texts
        return self.hf.generate(input, max_new_tokens=max_new_tokens, **kwargs)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"BridgedModel({type(self.hf).__name__}: {c.num_layers} layers x {c.num_heads} "
            f"heads through multihead's attention)"
        )


def _is_text(x: object) -> bool:
    return isinstance(x, str) or (
        isinstance(x, (list, tuple)) and bool(x) and all(isinstance(t, str) for t in x)
    )


# -- wrapping -------------------------------------------------------------------------------


def _check_wrappable(model: object) -> None:
    if isinstance(model, BridgedModel) or getattr(model, MARK, False):
        raise ValueError(
            f"{type(model).__name__} is already wrapped by multihead's bridge: use it as it is"
        )
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is what is wrapped
        raise TypeError("multihead.wrap needs transformers installed") from None
    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"multihead.wrap takes a transformers PreTrainedModel, got {type(model).__name__}"
        )
    chosen = getattr(model.config, "_attn_implementation", None)
    if chosen not in REPLACEABLE:
        raise ValueError(
            f"{type(model).__name__}'s config sets attn_implementation={chosen!r}; the bridge "
            f"replaces transformers' defaults ('eager', 'sdpa') with multihead's attention and "
            f"will not override a choice of another implementation: load the model without it"
        )
    if not type(model)._can_set_attn_implementation():
        raise BridgeError(
            f"{type(model).__name__} does not use transformers' attention registry "
            "(AttentionInterface), so multihead's attention cannot be put inside it"
        )


def _alias_plan(
    root: nn.Module, path: str, last: str, *, keep_path: bool = False
) -> list[tuple[nn.Module, str, str]]:
    """(module, child, alias) for every step of `path` below `root`: the last named `last`,
    the others transparent ("") or, with `keep_path`, under their own names."""
    steps = path.split(".")
    plan, module = [], root
    for i, step in enumerate(steps):
        alias = last if i == len(steps) - 1 else (step if keep_path else "")
        plan.append((module, step, alias))
        module = module.get_submodule(step)
    return plan


def _apply_aliases(plan: list[tuple[nn.Module, str, str]]) -> None:
    for module, child, alias in plan:
        current = dict(getattr(module, "hook_alias", {}))
        if current.get(child, alias) != alias:
            raise BridgeError(
                f"{type(module).__name__}.{child} would be named both {current[child]!r} and "
                f"{alias!r} by the bridge's hook names"
            )
        current[child] = alias
        setattr(module, "hook_alias", current)  # noqa: B010 (an nn.Module's plain attribute)


def _attention_points(attn: nn.Module, out_proj: nn.Linear | None, heads: int, kv: int) -> None:
    points = ATTENTION_HOOK_POINTS if out_proj is not None else ATTENTION_HOOK_POINTS[:-1]
    setattr(attn, "hook_points", points)  # noqa: B010
    for name, value in (("num_heads", heads), ("num_kv_heads", kv)):
        have = getattr(attn, name, None)
        if have is None:
            setattr(attn, name, value)
        elif have != value:
            raise BridgeError(f"{type(attn).__name__}.{name} is {have}, the config says {value}")


def _install_result(attn: nn.Module, out_proj: nn.Linear, heads: int) -> Any:
    """hook_result at the output projection: each head's slice of its input times its columns."""

    def result(module: Any, args: tuple, out: Tensor) -> Tensor | None:
        hooks = hooks_for(attn)
        if hooks is None or "hook_result" not in hooks:
            return None
        z = args[0]
        B, T = z.shape[0], z.shape[1]
        z = z.reshape(B, T, heads, -1).transpose(1, 2)  # (B, T, H * Dv) -> (B, H, T, Dv)
        return head_results(z, module.weight, module.bias, hooks)

    return out_proj.register_forward_hook(result)


def _install_layer(parts: LayerParts) -> list[Any]:
    layer = parts.layer
    handles = []

    def resid_pre(module: nn.Module, args: tuple, kwargs: dict) -> Any:
        hooks = hooks_for(module)
        if hooks is None:
            return None
        x = args[0] if args else kwargs["hidden_states"]
        _SHAPES.set({**(_SHAPES.get() or {}), id(module): tuple(x.shape)})  # see _stream_view
        if "hook_resid_pre" not in hooks:
            return None
        if args:
            return (hooks("hook_resid_pre", args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hooks("hook_resid_pre", kwargs["hidden_states"])}

    handles.append(layer.register_forward_pre_hook(resid_pre, with_kwargs=True))
    handles.append(
        parts.attn.register_forward_hook(lambda m, a, o: _show(layer, "hook_attn_out", o))
    )
    if parts.cross is not None:
        handles.append(
            parts.cross.register_forward_hook(
                lambda m, a, o: _show(layer, "hook_cross_attn_out", o)
            )
        )
    if parts.mid is not None:
        kind, where = parts.mid
        if kind == "sublayer":
            handles.append(
                where.register_forward_hook(lambda m, a, o: _show(layer, "hook_resid_mid", o))
            )
        else:

            def mid(module: nn.Module, args: tuple, kwargs: dict) -> None:
                x = args[0] if args else next(iter(kwargs.values()))
                _read_only(layer, "hook_resid_mid", x)

            handles.append(where.register_forward_pre_hook(mid, with_kwargs=True))
    if parts.cross_mid is not None:
        handles.append(
            parts.cross_mid.register_forward_hook(
                lambda m, a, o: _show(layer, "hook_resid_mid_cross", o)
            )
        )
    handles.append(parts.mlp.register_forward_hook(lambda m, a, o: _show(layer, "hook_mlp_out", o)))
    handles.append(layer.register_forward_hook(lambda m, a, o: _show(m, "hook_resid_post", o)))
    return handles


def _layer_points(parts: LayerParts) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(hook_points, hook_order) of a layer."""
    attn_child = parts.attn_path.split(".")[0]
    mlp_child = parts.mlp_path.split(".")[0]
    points = ["hook_resid_pre", "hook_attn_out"]
    points += ["hook_resid_mid"] if parts.mid is not None else []
    points += ["hook_cross_attn_out"] if parts.cross is not None else []
    points += ["hook_resid_mid_cross"] if parts.cross_mid is not None else []
    points += ["hook_mlp_out", "hook_resid_post"]
    order = ["hook_resid_pre", attn_child, *points[1:-2], mlp_child, *points[-2:]]
    return tuple(points), tuple(dict.fromkeys(order))


def wrap(model: Any, tokenizer: Any = None) -> BridgedModel:
    """Route every attention layer of a transformers `PreTrainedModel` through multihead's
    attention and put multihead's hook points on it. Returns a `BridgedModel` (an nn.Module
    holding `model` as `.hf`); `model` itself is changed in place (see the module docstring).
    `tokenizer`: a transformers tokenizer for the text methods (to_tokens, generate("text")).

    Refused, before anything changes: an object that is not a PreTrainedModel (TypeError), a
    model already wrapped, a config whose attn_implementation the user set to another
    implementation, and an architecture that does not call transformers' attention registry
    or whose layers cannot be found (`BridgeError`, a ValueError naming what is missing)."""
    _check_wrappable(model)
    register()
    stacks = discover(model, model.config)
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    # Plan every name first, so a conflict refuses before anything is changed. One stack
    # (decoder-only) is the top: blocks.{i}; several keep their path: encoder.blocks.{i}.
    plans = []
    for stack in stacks:
        plans += _alias_plan(model, stack.path, "blocks", keep_path=len(stacks) > 1)
        for parts in stack.layers:
            plans += _alias_plan(parts.layer, parts.attn_path, "attn")
            plans += _alias_plan(parts.layer, parts.mlp_path, "mlp")
            if parts.cross_path is not None:
                plans += _alias_plan(parts.layer, parts.cross_path, "cross_attn")
    _apply_aliases(plans)
    model.set_attn_implementation(NAME)
    if getattr(model.config, "_attn_implementation", None) != NAME:
        raise BridgeError(
            f"{type(model).__name__} did not take attn_implementation={NAME!r} "
            f"(it kept {model.config._attn_implementation!r})"
        )
    bridged = BridgedModel(model, stacks, tokenizer)
    handles = []
    for stack in stacks:
        for parts in stack.layers:
            _attention_points(parts.attn, parts.out_proj, heads, kv)
            if parts.cross is not None:
                _attention_points(parts.cross, parts.cross_out_proj, heads, kv)
                if parts.cross_out_proj is not None:
                    handles.append(_install_result(parts.cross, parts.cross_out_proj, heads))
            if parts.out_proj is not None:
                handles.append(_install_result(parts.attn, parts.out_proj, heads))
            points, order = _layer_points(parts)
            setattr(parts.layer, "hook_points", points)  # noqa: B010
            setattr(parts.layer, "hook_order", order)  # noqa: B010
            handles += _install_layer(parts)
    embed = model.get_input_embeddings()
    handles.append(embed.register_forward_hook(lambda m, a, o: _show(bridged, "hook_embed", o)))
    bridged._handles = handles  # type: ignore[assignment]  # torch hook handles, kept
    setattr(model, MARK, True)
    return bridged
