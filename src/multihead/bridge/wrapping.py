"""`wrap(model)`: a transformers model with multihead's attention inside and multihead's hook
points on it, as a `BridgedModel` (see `bridge.model`). Everything is found and checked first;
only then is the model changed, so a refused model is left as it was."""

from __future__ import annotations

from typing import Any

from .attention import NAME, register
from .discover import BridgeError, discover, uses_registry
from .layer_hooks import (
    alias_plan,
    apply_aliases,
    attention_points,
    install_layer,
    install_result,
    layer_points,
    set_owner,
    shows,
)
from .model import MARK, BridgedModel

# transformers' own defaults, which the bridge replaces; any other choice is the user's
REPLACEABLE = (None, "eager", "sdpa")


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
    if not uses_registry(type(model)):
        raise BridgeError(
            f"{type(model).__name__} does not use transformers' attention registry "
            "(AttentionInterface), so multihead's attention cannot be put inside it"
        )


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
        plans += alias_plan(model, stack.path, "blocks", keep_path=len(stacks) > 1)
        for parts in stack.layers:
            plans += alias_plan(parts.layer, parts.attn_path, "attn")
            plans += alias_plan(parts.layer, parts.mlp_path, "mlp")
            if parts.cross_path is not None:
                plans += alias_plan(parts.layer, parts.cross_path, "cross_attn")
    apply_aliases(plans)
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
            attention_points(parts.attn, parts.out_proj, heads, kv)
            if parts.cross is not None:
                attention_points(parts.cross, parts.cross_out_proj, heads, kv)
                if parts.cross_out_proj is not None:
                    handles.append(install_result(parts.cross, parts.cross_out_proj, heads))
            if parts.out_proj is not None:
                handles.append(install_result(parts.attn, parts.out_proj, heads))
            points, order = layer_points(parts)
            setattr(parts.layer, "hook_points", points)  # noqa: B010
            setattr(parts.layer, "hook_order", order)  # noqa: B010
            handles += install_layer(parts)
    embed = model.get_input_embeddings()
    set_owner(embed, bridged)
    handles.append(embed.register_forward_hook(shows("hook_embed")))
    bridged._handles = handles  # type: ignore[assignment]  # torch hook handles, kept
    setattr(model, MARK, True)
    return bridged
