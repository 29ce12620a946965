"""Residual-stream algebra on a cache, with TransformerLens's names and semantics.

    logits, cache = run_with_cache(model, ids)
    stack, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)  # logit lens
    heads = cache.stack_head_results()              # (L*H, B, T, C): each head's z @ W_O
    parts = cache.decompose_resid()                 # embed, pos_embed, {l}_attn_out, {l}_mlp_out
    attrs = cache.logit_attrs(cache.apply_ln_to_stack(parts), answers, wrong)  # (n, B, T)

A pre-norm model's final stream is a sum of its components, so `decompose_resid()` and
`get_full_resid_decomposition()` sum back to `blocks.{L-1}.hook_resid_post`. The norm in front of
the unembedding (or of a block) is not linear; `apply_ln_to_stack` freezes it as TransformerLens
does: every component is divided by the scale of the real stream (`hook_scale`: sqrt(var + eps)
for LayerNorm, which also centres each component; sqrt(mean(x^2) + eps) for RMSNorm, which does
not centre). The norm's weight is left to the direction (`logit_attrs` folds it into the
unembedding directions) and its bias is a constant, so through the final norm and unembedding
the attributions sum to the logit minus b_ln . W_U[:, token].

The scale is read from the cache (`ln_final.hook_scale`, `blocks.{l}.ln1/ln2.hook_scale`) when
it holds it, else recomputed from the cached stream the norm reads (resid_post of the last
block, resid_pre / resid_mid of block l): the same number either way.

Shapes: a stack is (n, B, T, C) ((n, T, C) after `remove_batch_dim`); C = d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..modules.norm import RMSNorm

PosSlice = int | slice | Sequence[int] | Tensor | None


def _slice(t: Tensor, index: PosSlice, dim: int) -> Tensor:
    """TransformerLens's Slice: None keeps all, an int keeps the dimension with size 1 dropped
    (as TL does), a slice or index list/tensor selects."""
    if index is None:
        return t
    if isinstance(index, int):
        return t.select(dim, index)
    if isinstance(index, slice):
        return t[(slice(None),) * (dim % t.dim()) + (index,)]
    idx = torch.as_tensor(index, device=t.device)
    return t.index_select(dim, idx)


class CacheAlgebra:
    """Mixin of `ActivationCache`: the residual stream decomposed, normalised and attributed."""

    _store: dict[str, Tensor]
    model: nn.Module | None
    has_batch_dim: bool

    # ---- what the cache and model hold --------------------------------------------------

    def _act(self, name: str) -> Tensor:
        try:
            return self._store[name]
        except KeyError:
            raise KeyError(
                f"this cache holds no {name!r}: run run_with_cache with it among `names` "
                "(the default caches every hook point)"
            ) from None

    def _lm(self) -> Any:
        """The model the cache was taken from, with blocks (`layers`) and a final norm."""
        model = getattr(self.model, "_orig_mod", self.model)
        if model is None or not hasattr(model, "layers") or not hasattr(model, "norm_f"):
            got = "no model" if model is None else type(model).__name__
            raise TypeError(
                "this needs the model the cache was taken from (a CausalLM: blocks and a final "
                f"norm); the cache has {got}. Use run_with_cache(model, ...) or "
                "ActivationCache(store, model=model)"
            )
        return model

    @property
    def n_layers(self) -> int:
        if self.model is not None and hasattr(self._lm(), "layers"):
            return len(self._lm().layers)
        n = 0
        while f"blocks.{n}.hook_resid_pre" in self._store:
            n += 1
        return n

    def _layer(self, layer: int | None) -> int:
        """TL's convention: None, -1 and n_layers all mean "after the last block"."""
        L = self.n_layers
        if layer is None or layer == -1:
            return L
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= L:
            raise ValueError(f"layer must be in [0, {L}], -1 or None, got {layer!r}")
        return layer

    # ---- stacks --------------------------------------------------------------------------

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """The residual stream as it stood before each block up to `layer` ("{l}_pre", with
        `incl_mid` also "{l}_mid"), and with layer None/-1/n_layers the final stream
        ("final_post"): (n, B, T, C). `apply_ln`: through the norm that reads `layer`; for the
        final norm each stream is normalised with its own statistics (the logit lens), as
        TransformerLens's `recompute_ln` does."""
        L, layer = self.n_layers, self._layer(layer)
        parts: list[Tensor] = []
        labels: list[str] = []
        for i in range(layer + 1):
            if i == L:
                parts.append(self._act(f"blocks.{L - 1}.hook_resid_post"))
                labels.append("final_post")
                continue
            parts.append(self._act(f"blocks.{i}.hook_resid_pre"))
            labels.append(f"{i}_pre")
            if (incl_mid and i < layer) or (mlp_input and i == layer and self._mlp_reads_mid(i)):
                parts.append(self._act(f"blocks.{i}.hook_resid_mid"))
                labels.append(f"{i}_mid")
        stack = torch.stack([_slice(p, pos_slice, -2) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(
                stack, layer, mlp_input=mlp_input, pos_slice=pos_slice, recompute_ln=layer == L
            )
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """The stream that enters block `layer` as the outputs that wrote it: "embed",
        "pos_embed" (learned positions), then "{l}_attn_out" and "{l}_mlp_out" per block
        (`mode` "attn"/"mlp" keeps one kind); `mlp_input` adds block `layer`'s attention (not
        in a parallel block: its MLP reads resid_pre).
        Summed, they are `resid_pre` of `layer` (the final stream for None/-1/n_layers)."""
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        layer = self._layer(layer)
        mlp_input = mlp_input and self._mlp_reads_mid(layer)  # (a parallel MLP reads resid_pre)
        parts: list[Tensor] = []
        labels: list[str] = []
        if incl_embeds:
            for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
                if name in self._store:
                    parts.append(self._store[name])
                    labels.append(label)
        for i in range(layer + (1 if mlp_input else 0)):
            if mode != "mlp":
                parts.append(self._act(f"blocks.{i}.hook_attn_out"))
                labels.append(f"{i}_attn_out")
            mlp = f"blocks.{i}.hook_mlp_out"
            if mode != "attn" and i < layer and mlp in self._store:  # attention-only: no MLP
                parts.append(self._store[mlp])
                labels.append(f"{i}_mlp_out")
        if not parts:
            raise ValueError("nothing to decompose: no embeddings and no blocks selected")
        stack = torch.stack([_slice(p, pos_slice, -2) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def _head_results(self, layer: int) -> Tensor:
        """(..., T, H, C): each head's output z_h @ W_O[h] from the cached hook_z, without a
        second run (the output projection's bias is not a head's; it sums into attn_out)."""
        if getattr(self._lm().layers[layer], "norm1_post", None) is not None:
            raise ValueError(
                f"blocks.{layer}.ln1_post normalises the attention output before it joins the "
                "stream (Gemma 2/3, OLMo 2), so heads' results do not sum to it; "
                "direct_logit_attribution freezes that norm's scale per head"
            )
        cached = self._store.get(f"blocks.{layer}.attn.hook_result")
        if cached is not None:
            return cached
        z = self._act(f"blocks.{layer}.attn.hook_z")  # (..., T, H, D)
        w = self._lm().layers[layer].attn.out_proj.weight  # (C, H * D)
        H, D = z.shape[-2], z.shape[-1]
        w_o = w.t().reshape(H, D, w.shape[0]).to(z.dtype)  # (H, D, C): W_O per head
        return torch.einsum("...hd,hdc->...hc", z, w_o)

    def stack_head_results(
        self,
        layer: int | None = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """Each head's contribution to the stream, of every block before `layer` (-1/None: all):
        (layer * H, B, T, C), labels "L{l}H{h}". `incl_remainder` adds the rest of the stream
        at `layer` (embeddings, MLPs, biases) as a last component, so the stack sums to it."""
        layer = self._layer(layer)
        parts: list[Tensor] = []
        labels: list[str] = []
        for i in range(layer):
            r = _slice(self._head_results(i), pos_slice, -3)  # (..., T, H, C)
            parts.append(r.movedim(-2, 0))  # -> (H, ..., T, C)
            labels += [f"L{i}H{h}" for h in range(r.shape[-2])]
        if incl_remainder:
            stream = self._stream_before(layer, mlp_input=False)
            stream = _slice(stream, pos_slice, -2)
            done = torch.cat(parts).sum(0) if parts else torch.zeros_like(stream)
            parts.append((stream - done)[None])
            labels.append("remainder")
        if not parts:
            raise ValueError("no heads before layer 0: pass a later layer or incl_remainder=True")
        stack = torch.cat(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        return_labels: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """Every head ("L{l}H{h}"), every MLP ("{l}_mlp_out"), the embeddings and the summed
        output-projection biases ("bias"): they sum to the stream entering `layer`. (MLPs are
        whole: TransformerLens's expand_neurons is not offered.)"""
        layer = self._layer(layer)
        lm = self._lm()
        heads, labels = self.stack_head_results(layer, return_labels=True, pos_slice=pos_slice)
        parts, names = [heads], list(labels)
        mlp_input = mlp_input and self._mlp_reads_mid(layer)  # (a parallel MLP reads resid_pre)
        if mlp_input and layer < self.n_layers:
            more = _slice(self._head_results(layer), pos_slice, -3).movedim(-2, 0)
            parts.append(more)
            names += [f"L{layer}H{h}" for h in range(more.shape[0])]
        rest, rest_labels = self.decompose_resid(
            layer, mode="mlp", pos_slice=pos_slice, return_labels=True
        )
        parts.append(rest)
        names += rest_labels
        bias = torch.zeros_like(heads[0])
        for i in range(layer + (1 if mlp_input and layer < self.n_layers else 0)):
            b = lm.layers[i].attn.out_proj.bias
            if b is not None:
                bias = bias + b.to(bias.dtype)
        parts.append(bias[None])
        names.append("bias")
        stack = torch.cat(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
        return (stack, names) if return_labels else stack

    # ---- norms and directions ------------------------------------------------------------

    def _mlp_reads_mid(self, layer: int) -> bool:
        """Whether block `layer`'s MLP reads resid_mid: not in a parallel block (GPT-NeoX's
        use_parallel_residual), whose MLP reads the block's input, resid_pre."""
        if layer >= self.n_layers or self.model is None:
            return True
        return not getattr(self._lm().layers[layer], "parallel", False)

    def _stream_before(self, layer: int, mlp_input: bool) -> Tensor:
        """The stream the norm in front of `layer` reads (the final norm for n_layers)."""
        if layer == self.n_layers:
            return self._act(f"blocks.{layer - 1}.hook_resid_post")
        mid = mlp_input and self._mlp_reads_mid(layer)
        return self._act(f"blocks.{layer}.hook_resid_{'mid' if mid else 'pre'}")

    def _norm(self, layer: int, mlp_input: bool) -> tuple[nn.Module, str]:
        lm = self._lm()
        if layer == len(lm.layers):
            return lm.norm_f, "ln_final.hook_scale"
        block = lm.layers[layer]
        if not getattr(block, "norm_first", True):
            raise ValueError("a post-norm block has no norm in front of it to apply")
        norm = block.norm2 if mlp_input else block.norm1
        if norm is None:
            raise ValueError(
                f"block {layer} has no norm before its {'MLP' if mlp_input else 'attention'} "
                "(OLMo 2 normalises each branch's output instead): nothing to apply"
            )
        if mlp_input:
            return norm, f"blocks.{layer}.ln2.hook_scale"
        return norm, f"blocks.{layer}.ln1.hook_scale"

    def apply_ln_to_stack(
        self,
        residual_stack: Tensor,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: PosSlice = None,
        batch_slice: PosSlice = None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
    ) -> Tensor:
        """`residual_stack` (..., [B,] T, C) through the norm in front of `layer` (None/-1: the
        final norm) with its scale frozen at the cached stream's: centred (LayerNorm only) and
        divided by `hook_scale`. The norm's weight and bias are not applied (TransformerLens
        folds them into the next weights; `logit_attrs` folds the weight into the direction).
        `recompute_ln`: each component normalised by its own statistics instead."""
        layer = self._layer(layer)
        norm, scale_name = self._norm(layer, mlp_input)
        centre = not isinstance(norm, RMSNorm)
        if centre:
            residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
        eps = float(getattr(norm, "eps", 0.0))
        if recompute_ln:
            scale = (residual_stack.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            return residual_stack / scale
        cached = self._store.get(scale_name)
        if cached is not None:
            scale = cached
        else:  # recompute it from the stream the norm read: the same number
            x = self._stream_before(layer, mlp_input)
            x = x.to(torch.promote_types(x.dtype, torch.float32))  # the norms compute in fp32+
            if centre:
                x = x - x.mean(-1, keepdim=True)
            scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt().to(residual_stack.dtype)
        batch_dims = has_batch_dim and self.has_batch_dim
        scale = _slice(scale, pos_slice, -2)
        if batch_dims:
            scale = _slice(scale, batch_slice, 0)
        return residual_stack / scale

    def tokens_to_residual_directions(self, tokens: Tensor | int) -> Tensor:
        """The unembedding columns of `tokens` (... ) -> (..., C), with the final norm's weight
        folded in (the direction a normalised stream is read along)."""
        lm = self._lm()
        w_u = lm.head.weight  # (V, C)
        ids = torch.as_tensor(tokens, device=w_u.device)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"tokens must be token ids (int), got {ids.dtype}")
        V = w_u.shape[0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
            raise ValueError(f"tokens must be ids in [0, {V}), got {ids.min()}..{ids.max()}")
        direction = w_u[ids]
        norm = lm.norm_f
        weight = norm.gain() if isinstance(norm, RMSNorm) else getattr(norm, "weight", None)
        return direction if weight is None else direction * weight

    def logit_attrs(
        self,
        residual_stack: Tensor,
        tokens: Tensor | int,
        incorrect_tokens: Tensor | int | None = None,
        pos_slice: PosSlice = None,
        batch_slice: PosSlice = None,
        has_batch_dim: bool = True,
    ) -> Tensor:
        """Each component's direct effect on the logit of `tokens` (minus `incorrect_tokens`):
        (n, B, T) for a stack (n, B, T, C). `tokens`: an int, (B,) one per sequence, or (B, T)
        one per position. Normalises the stack with the final norm's frozen scale first (do
        not pass a stack already through `apply_ln_to_stack`... unless you want it twice:
        TransformerLens does the same)."""
        directions = self.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            wrong = self.tokens_to_residual_directions(incorrect_tokens)
            if wrong.shape != directions.shape:
                raise ValueError(
                    f"tokens {tuple(directions.shape[:-1])} and incorrect_tokens "
                    f"{tuple(wrong.shape[:-1])} must have the same shape"
                )
            directions = directions - wrong
        scaled = self.apply_ln_to_stack(
            residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice,
            has_batch_dim=has_batch_dim,
        )  # fmt: skip
        return self.direction_attrs(scaled, directions, per_sequence=has_batch_dim)

    @staticmethod
    def direction_attrs(stack: Tensor, direction: Tensor, *, per_sequence: bool = True) -> Tensor:
        """Each component's projection on any `direction` (a probe, a difference of means, an
        unembedding column): `stack` (n, B, T, C) . `direction` (C,), (B, C) one per sequence,
        or (B, T, C) one per position -> (n, B, T). No norm is applied: normalise the stack
        first (`apply_ln_to_stack`) to read it as a norm-reading layer would."""
        if direction.shape[-1] != stack.shape[-1]:
            raise ValueError(
                f"direction {tuple(direction.shape)} must end in d_model = {stack.shape[-1]}"
            )
        if per_sequence and direction.dim() == 2 and stack.dim() == 4:  # (B, C) -> (B, 1, C)
            direction = direction[:, None]
        return (stack * direction.to(stack.dtype)).sum(-1)

    def remove_batch_dim(self) -> Any:
        """Drop the batch dimension of a batch-1 cache (in place, as TransformerLens does;
        returns the cache): activations become (T, ...), stacks (n, T, C)."""
        if not self.has_batch_dim:
            return self
        sizes = {name: t.shape[0] for name, t in self._store.items()}
        if any(size != 1 for size in sizes.values()):
            bad = next(name for name, size in sizes.items() if size != 1)
            raise ValueError(f"remove_batch_dim needs a batch of 1; {bad} has batch {sizes[bad]}")
        self._store = {name: t[0] for name, t in self._store.items()}
        self.has_batch_dim = False
        return self
