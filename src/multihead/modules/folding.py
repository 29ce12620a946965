"""Weight processing as TransformerLens' `process_weights_`: fold norms into the weights that read
them, centre what writes to the residual stream, centre the unembedding. The model computes the
same function afterwards (logits within float rounding; `center_unembed` shifts each position's
logits by a constant, which softmax ignores), with simpler weights to read:

- fold_ln: a pre-norm's weight w (and LayerNorm's bias b) move into each layer that reads the
  norm: W x_hat * w + ... = (W diag(w)) x_hat, bias + W b. For LayerNorm the reading weights are
  then centred along d_model too (the normalised input has mean 0, so that component of W does
  nothing). The norms become scale-only (LayerNormPre / RMSNormPre): after folding,
  `ln1.hook_normalized @ W_Q + b_Q` is `hook_q`.
- center_writing_weights (LayerNorm models only): every matrix and bias that writes to the
  residual stream (W_E, W_pos, W_O, b_O, W_out, b_out) loses its mean along d_model; every
  reader of the stream is a LayerNorm, which removes that mean anyway.
- center_unembed: W_U and b_U lose their mean over the vocabulary.

Gemma's RMSNorm gain (1 + w) folds as its gain. Norms after a projection (q/k norms) or after a
branch (Gemma 2/3 and OLMo 2's post-norms) have no reader to fold into and stay as they are;
centring the unembedding is refused under a final-logit soft-cap (tanh does not pass a shift
through). RMSNorm removes no mean, so RMSNorm models are folded only (TransformerLens' rule):
the two centrings are skipped with a warning. Post-norm encoders (BERT: the residual stream
itself is a norm's output) and cross-attention decoders cannot be folded this way: they raise.

Arithmetic runs in float64 and is written back in place in the parameters' dtype, so the
parameters keep their memory layout (CausalLM's column-major matrices).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from .block import TransformerBlock
from .norm import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from .quantized.linear import shares_packed, unpack_


def process_weights_(
    model: nn.Module,
    *,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
) -> nn.Module:
    """Fold and centre `model`'s weights in place (see the module docstring); returns `model`."""
    for name, flag in (
        ("fold_ln", fold_ln),
        ("center_writing_weights", center_writing_weights),
        ("center_unembed", center_unembed),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    blocks: list[TransformerBlock] = list(model.layers)  # type: ignore[arg-type]
    _check_foldable(model, blocks, fold_ln or center_writing_weights)
    config = getattr(model, "config", None)
    cap = getattr(config, "final_softcap", None)
    if center_unembed and cap is not None:
        raise ValueError(
            f"center_unembed: this model soft-caps its logits (final_softcap="
            f"{cap}), so a constant shift of the logits does not pass through "
            "unchanged; pass center_unembed=False"
        )
    parts: dict[str, Any] = model.weight_parts()  # type: ignore[operator]
    final = _final_norm(model)
    # (the first norm the blocks have: OLMo 2 has no norm1, ModernBERT's layer 0 an Identity)
    norms = [n for b in blocks for n in (b.norm1, b.norm2) if _is_norm(n)]
    layer_norm = isinstance(norms[0] if norms else final, LayerNorm)
    if not layer_norm and center_writing_weights:
        warnings.warn(
            "center_writing_weights is skipped for RMSNorm models: RMSNorm does not remove the "
            "mean, so the mean of what writes to the residual stream matters",
            stacklevel=3,
        )
        center_writing_weights = False
    head = parts.get("unembed")
    if head is not None and (fold_ln or center_writing_weights or center_unembed):
        _untie(model, head, parts.get("embed"))
    with torch.no_grad():
        if fold_ln:
            for block in blocks:  # (OLMo 2 has no norm before its branches, ModernBERT's
                # first layer an Identity before attention: nothing to fold there)
                if _is_norm(block.norm1):
                    _fold(block, "norm1", _attention_readers(block))
                if block.ffn is not None and _is_norm(block.norm2):
                    _fold(block, "norm2", _mlp_readers(block.ffn))
            if final is not None and head is not None:  # a headless stack's output is the norm's
                _fold(model, _final_name(model), [head])
        if center_writing_weights:
            for key in ("embed", "pos"):
                if parts.get(key) is not None:
                    _centre_rows(unpack_(parts[key]).weight)
            for block in blocks:
                _centre_writer(block.attn.out_proj)
                if block.ffn is not None:
                    ffn: Any = block.ffn
                    _centre_writer(ffn.fc2 if hasattr(ffn, "fc2") else ffn.down)
        if center_unembed:
            if head is None:
                raise ValueError(f"center_unembed: {type(model).__name__} has no unembedding")
            _sub_mean(unpack_(head).weight, dim=0)  # (V, C): mean over the vocabulary
            if head.bias is not None:
                _sub_mean(head.bias, dim=0)
    return model


def _check_foldable(model: nn.Module, blocks: list[TransformerBlock], norms: bool) -> None:
    if not norms:
        return
    for i, block in enumerate(blocks):
        if not block.norm_first:
            raise ValueError(
                f"{type(model).__name__} has post-norm blocks (layer {i}): the residual stream is "
                "a norm's output there, so its norms cannot be folded into the next weights and "
                "its writers cannot be centred (TransformerLens refuses BERT alike); pass "
                "fold_ln=False, center_writing_weights=False"
            )
        if block.cross_attn is not None:
            raise ValueError(
                f"layer {i} has cross-attention, whose keys do not read this stream's norm: "
                "fold_ln and center_writing_weights support self-attention stacks"
            )


def _is_norm(module: nn.Module | None) -> bool:
    return isinstance(module, (LayerNorm, RMSNorm))


def _final_name(model: nn.Module) -> str:
    return "norm_f" if hasattr(model, "norm_f") else "norm"


def _final_norm(model: nn.Module) -> nn.Module | None:
    norm = getattr(model, _final_name(model), None)
    return norm if isinstance(norm, (LayerNorm, RMSNorm)) else None


def _attention_readers(block: TransformerBlock) -> list[nn.Linear]:
    a = block.attn
    return [a.in_proj] if a.packed else [a.q_proj, a.k_proj, a.v_proj]


def _mlp_readers(ffn: nn.Module) -> list[nn.Linear]:
    return [ffn.gate, ffn.up] if hasattr(ffn, "gate") else [ffn.fc1]  # type: ignore[list-item]


def _fold(owner: nn.Module, attr: str, readers: list[nn.Linear]) -> None:
    """Move the norm `owner.attr`'s weight and bias into `readers`; leave a scale-only norm."""
    norm = getattr(owner, attr)
    gain = norm.gain() if isinstance(norm, RMSNorm) else norm.weight  # (Gemma: 1 + w)
    w = None if gain is None else gain.double()  # (C,)
    b = None if norm.bias is None else norm.bias.double()
    centre = isinstance(norm, LayerNorm)
    for layer in readers:
        unpack_(layer)  # a packed (quantized) matrix is dequantised to take the fold
        W = layer.weight.double()  # (out, C)
        if b is not None:  # bias + W b, before W is scaled
            shift = W @ b
            if layer.bias is None:
                layer.bias = nn.Parameter(shift.to(layer.weight.dtype))
            else:
                layer.bias.copy_(layer.bias.double() + shift)
        if w is not None:
            W = W * w
        if centre:  # the normalised input has mean 0: W's mean along d_model reads nothing
            W = W - W.mean(-1, keepdim=True)
        layer.weight.copy_(W)
    dim = norm.normalized_shape[0]
    factory = {"device": norm_device(norm), "dtype": norm_dtype(norm)}
    pre = LayerNormPre(dim, norm.eps, **factory) if centre else RMSNormPre(dim, norm.eps, **factory)
    setattr(owner, attr, pre)


def norm_device(norm: nn.Module) -> torch.device | None:
    p = next(iter(norm.parameters()), None)
    return None if p is None else p.device


def norm_dtype(norm: nn.Module) -> torch.dtype | None:
    p = next(iter(norm.parameters()), None)
    return None if p is None else p.dtype


def _sub_mean(t: Tensor, dim: int) -> None:
    t.copy_(t.double() - t.double().mean(dim, keepdim=True))


def _centre_rows(weight: Tensor) -> None:
    """An embedding table (N, C): each row loses its mean over C."""
    _sub_mean(weight, dim=-1)


def _centre_writer(layer: nn.Linear) -> None:
    """A layer writing to the stream, weight (C, in): each output column loses its mean over C."""
    _sub_mean(unpack_(layer).weight, dim=0)
    if layer.bias is not None:
        _sub_mean(layer.bias, dim=0)


def _untie(model: Any, head: nn.Linear, embed: nn.Module | None) -> None:
    """Give the head its own weight when it shares the embedding's: folding changes one and
    not the other."""
    if embed is None:
        return
    if shares_packed(head, embed):  # one packed matrix: the head gets its dequantised copy
        unpack_(head)
    elif head.weight is not embed.weight:
        return
    else:
        head.weight = nn.Parameter(embed.weight.detach().clone())
    config = getattr(model, "config", None)
    # a frozen config dataclass with a tie flag (LMConfig): no import of lm.py (which imports us)
    tied = getattr(config, "tie_embeddings", False)
    if dataclasses.is_dataclass(config) and not isinstance(config, type) and tied:
        # the head is its own tensor now (state_dict, loading and saving see two)
        model.config = dataclasses.replace(config, tie_embeddings=False)
