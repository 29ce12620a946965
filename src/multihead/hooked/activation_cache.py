"""The activations of one run by hook name (`ActivationCache`, with TransformerLens'
shorthands and, through `CacheAlgebra`, its residual-stream algebra), and `act_name`, the
shorthand -> hook name rule both the cache and the hook tools read."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

from .cache_algebra import CacheAlgebra

ATTENTION_ACTS = {"q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "result"}
BLOCK_ACTS = {
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "attn_in",
    "q_input",
    "k_input",
    "v_input",
}
MLP_ACTS = {"pre", "post", "pre_linear"}
NORM_ACTS = {"scale", "normalized"}
MODEL_ACTS = {"embed": "hook_embed", "pos_embed": "hook_pos_embed", "logits": "hook_logits"}


def act_name(name: str, layer: int | None = None, component: str = "attn") -> str:
    """TransformerLens' shorthand: ("pattern", 1) -> "blocks.1.attn.hook_pattern",
    ("resid_post", 0) -> "blocks.0.hook_resid_post", ("post", 0) -> "blocks.0.mlp.hook_post",
    ("scale", 0, "ln1") -> "blocks.0.ln1.hook_scale", "embed" -> "hook_embed", "scale" ->
    "ln_final.hook_scale"; `component="cross_attn"` for a decoder block's cross-attention."""
    if layer is None:
        if name in MODEL_ACTS:
            return MODEL_ACTS[name]
        if name in ("normalized", "ln_final"):
            return "ln_final.hook_normalized"
        if name == "scale":
            return "ln_final.hook_scale"
        return name
    if name in MLP_ACTS:
        return f"blocks.{layer}.mlp.hook_{name}"
    if name in NORM_ACTS:
        if component not in ("ln1", "ln2"):
            raise KeyError(f"{name!r} of layer {layer} needs component 'ln1' or 'ln2'")
        return f"blocks.{layer}.{component}.hook_{name}"
    if name in ATTENTION_ACTS:
        return f"blocks.{layer}.{component}.hook_{name}"
    if name in BLOCK_ACTS:
        return f"blocks.{layer}.hook_{name}"
    raise KeyError(f"unknown activation {name!r} for layer {layer}")


class ActivationCache(CacheAlgebra, Mapping[str, Tensor]):
    """Activations by hook name; `cache["pattern", 1]` and `cache["embed"]` are TransformerLens'
    shorthands. With the `model` they came from, the residual-stream algebra of
    `cache_algebra.CacheAlgebra` (accumulated_resid, decompose_resid, stack_head_results,
    apply_ln_to_stack, logit_attrs, remove_batch_dim)."""

    def __init__(
        self, store: dict[str, Tensor], model: nn.Module | None = None, has_batch_dim: bool = True
    ) -> None:
        self._store = store
        self.model = model
        self.has_batch_dim = has_batch_dim

    def _key(self, key: str | tuple) -> str:
        if isinstance(key, tuple):
            return act_name(*key)
        # "embed", "pos_embed", "normalized": TransformerLens' short names of model-level points
        return key if key in self._store else act_name(key)

    def __getitem__(self, key: str | tuple) -> Tensor:
        name = self._key(key)
        try:
            return self._store[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._store), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise KeyError(f"no activation {name!r} in this cache{hint}") from None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (str, tuple)) and self._key(key) in self._store

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations)"

    def stack(self, name: str, component: str = "attn") -> Tensor:
        """One activation of every block, stacked: e.g. "pattern" -> (layers, B, H, Tq, Tk)."""
        layers: list[Tensor] = []
        while act_name(name, len(layers), component) in self._store:
            layers.append(self._store[act_name(name, len(layers), component)])
        if not layers:
            raise KeyError(f"no {name!r} activations of blocks in this cache")
        return torch.stack(layers)
