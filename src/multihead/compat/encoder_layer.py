"""torch.nn.TransformerEncoderLayer whose self-attention module always runs.

In eval mode under no_grad, torch's encoder layer skips its `self_attn` module and calls a fused
kernel on its weights (the "fast path"), and TransformerEncoder turns padded batches into nested
tensors. A drop-in placed there would never run: fully padded items would come out NaN (torch's
kernel) although the drop-in gives zeros, and hooks on the drop-in would see nothing.
`replace_attention` gives converted layers this class in place (same parameters, buffers,
state_dict and isinstance), so the promise holds on every path. Its forward is torch's standard
path: the same masks, the same sublayers.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


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
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


def keep_attention_running(model: nn.Module) -> None:
    """Make every torch encoder layer (and encoder) in `model` call its attention module."""
    for module in model.modules():
        if type(module) is nn.TransformerEncoderLayer:
            module.__class__ = TransformerEncoderLayer
        elif isinstance(module, nn.TransformerEncoder):
            module.use_nested_tensor = False  # nested tensors would bypass the layers' modules
