"""torch.nn.TransformerEncoderLayer whose self-attention module always runs.

In eval mode under no_grad, torch's encoder layer skips its `self_attn` module and calls a fused
kernel on its weights (the "fast path"), and TransformerEncoder turns padded batches into nested
tensors. A drop-in placed there would never run: fully padded items would come out NaN (torch's
kernel) although the drop-in gives zeros, and hooks on the drop-in would see nothing.
`replace_attention` gives converted layers this class in place (same parameters, buffers,
state_dict and isinstance), so the promise holds on every path. Its forward is torch's standard
path: the same masks, the same sublayers.

One thing torch's two paths disagree on is kept as torch has it: where torch would take the fused
path, it applies `src_mask` and ignores `is_causal`; on its standard path the attention trusts the
`is_causal` hint instead of the mask (when there is no key padding mask). `torch_layer_fast_path`
repeats torch 2.13's conditions (flags, dtypes, devices, hooks; no tensor values).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_FUSED_DEVICES = ("cpu", "cuda", "xpu")


class TransformerEncoderLayer(nn.TransformerEncoderLayer):
    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        src_key_padding_mask = F._canonical_mask(
            mask=src_key_padding_mask,
            mask_name="src_key_padding_mask",
            other_type=F._none_or_dtype(src_mask),
            other_name="src_mask",
            target_type=src.dtype,
        )
        src_mask = F._canonical_mask(
            mask=src_mask,
            mask_name="src_mask",
            other_type=None,
            other_name="",
            target_type=src.dtype,
            check_other=False,
        )
        if is_causal and torch_layer_fast_path(self, src, src_mask, src_key_padding_mask):
            is_causal = False  # torch's fused layer would apply src_mask and ignore the hint
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


def torch_layer_fast_path(
    layer: nn.TransformerEncoderLayer,
    src: Tensor,
    src_mask: Tensor | None,
    src_key_padding_mask: Tensor | None,
) -> bool:
    """Whether torch.nn.TransformerEncoderLayer.forward would run its fused kernel here."""
    attn = layer.self_attn
    if not torch.backends.mha.get_fastpath_enabled() or src.dim() != 3 or layer.training:
        return False
    if not attn.batch_first or attn.in_proj_bias is None or not attn._qkv_same_embed_dim:
        return False
    if not layer.activation_relu_or_gelu or layer.norm1.eps != layer.norm2.eps:
        return False
    if src.is_nested and (src_key_padding_mask is not None or src_mask is not None):
        return False
    if attn.num_heads % 2 == 1 or torch.is_autocast_enabled():
        return False
    if any(m._forward_hooks or m._forward_pre_hooks for m in layer.modules()):
        return False
    args = (
        src,
        attn.in_proj_weight,
        attn.in_proj_bias,
        attn.out_proj.weight,
        attn.out_proj.bias,
        layer.norm1.weight,
        layer.norm1.bias,
        layer.norm2.weight,
        layer.norm2.bias,
        layer.linear1.weight,
        layer.linear1.bias,
        layer.linear2.weight,
        layer.linear2.bias,
    )
    if torch.overrides.has_torch_function(args):
        return False
    devices = (*_FUSED_DEVICES, torch.utils.backend_registration._privateuse1_backend_name)
    if not all(x.device.type in devices for x in args):
        return False
    return not (torch.is_grad_enabled() and any(x.requires_grad for x in args))


def keep_attention_running(model: nn.Module) -> None:
    """Make every torch encoder layer (and encoder) in `model` call its attention module."""
    for module in model.modules():
        if type(module) is nn.TransformerEncoderLayer:
            module.__class__ = TransformerEncoderLayer
        elif isinstance(module, nn.TransformerEncoder):
            module.use_nested_tensor = False  # nested tensors would bypass the layers' modules
