"""Position-wise feed-forward networks: Linear -> activation -> Linear.

Shapes: (..., C) -> (..., hidden) -> (..., C).

Hook points (TransformerLens' names): FeedForward hook_pre (fc1's output, before the
activation) and hook_post (after it: the neurons, what fc2 reads); SwiGLU (TransformerLens'
GatedMLP) hook_pre (the gate's pre-activation), hook_pre_linear (the up projection) and hook_post
(silu(gate) * up, what down reads). All (..., hidden). With no hooks the forward is the plain
one (in-place activation, chunked rows).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hook_points import hooks_for
from .projections import _plain, linear
from .quantized import linear_pair
from .quantized.linear import silu_pair


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


# In-place twins, used when autograd does not need the input (inference): writing into the
# fresh fc1 output avoids allocating (and page-faulting) a second hidden-width buffer, which
# measured ~20% of fc1 + activation time on CPU. Module-level functions (no lambdas), so a
# model holding them pickles (`torch.save(model)`).
_gelu_ = torch._C._nn.gelu_  # type: ignore[attr-defined]  # aten::gelu_, missing from the stubs


def _gelu_tanh_(x: Tensor) -> Tensor:
    return _gelu_(x, approximate="tanh")


def _silu_(x: Tensor) -> Tensor:
    return F.silu(x, inplace=True)


INPLACE: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": _gelu_,
    "gelu_new": _gelu_tanh_,
    "gelu_pytorch_tanh": _gelu_tanh_,
    "gelu_fast": _gelu_tanh_,
    "relu": torch.relu_,
    "silu": _silu_,
    "swish": _silu_,
    "tanh": torch.tanh_,
}


# Names as Hugging Face configs spell them ("hidden_act").
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,  # exact, erf-based (BERT)
    "gelu_new": _gelu_tanh,  # tanh approximation (GPT-2)
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}"
        ) from None


_activation = activation  # (for classes whose argument is named `activation`)


# Rows per chunk in inference, for inputs above that many rows (long padded batches). Inputs
# up to 2,048 rows (encode's packed batches) run whole: splitting those at 1,024 measured 3%
# slower, while an (32, 256, 384) batch runs 7% faster in 2,048-row chunks than whole (10% in
# 1,024-row ones; BERT-sized MLP, this CPU).
CHUNK_ROWS = 2048


class FeedForward(nn.Module):
    """`fc2(dropout(act(fc1(x))))`: the MLP of BERT and GPT-2 style blocks."""

    hook_points = ("hook_pre", "hook_post")

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        activation_name: str = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.act = activation(activation_name)
        self.act_ = INPLACE[activation_name]
        self.activation_name = activation_name
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias, device=device, dtype=dtype)
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name}"

    def forward(self, x: Tensor) -> Tensor:
        hooks = hooks_for(self)
        if hooks is not None:
            # Out of place: a hook may hold on to the pre-activation (a cache).
            h = self.act(hooks("hook_pre", self.fc1(x)))
            return self.fc2(self.dropout(hooks("hook_post", h)))
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows > CHUNK_ROWS and not torch.is_grad_enabled() and self._plain_linears():
            return self._forward_chunked(x)
        h = self.fc1(x)
        h = self.act(h) if h.requires_grad else self.act_(h)
        return self.fc2(self.dropout(h))

    def _plain_linears(self) -> bool:
        """Both layers are exactly F.linear on plain weights (no hooks, no DTensor shards), so
        the chunked path may use their weights directly."""
        return _plain(self.fc1) and _plain(self.fc2)

    def _forward_chunked(self, x: Tensor) -> Tensor:
        """Inference over CHUNK_ROWS rows at a time: the hidden-width intermediate stays in
        cache instead of a round trip through memory (measured ~10% faster on long inputs on
        CPU, bit-identical). Each chunk's fc2 writes straight into the output."""
        flat = x.reshape(-1, x.shape[-1])  # (N, C)
        out = flat.new_empty(flat.shape[0], self.fc2.out_features)
        w1, b1, w2, b2 = self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias
        for start in range(0, flat.shape[0], CHUNK_ROWS):
            h = self.act_(F.linear(flat[start : start + CHUNK_ROWS], w1, b1))
            piece = out[start : start + CHUNK_ROWS]
            if b2 is None:
                torch.mm(h, w2.t(), out=piece)
            else:
                torch.addmm(b2, h, w2.t(), out=piece)
        return out.view(*x.shape[:-1], self.fc2.out_features)


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))` (Shazeer 2020), the MLP of LLaMA-style blocks; with
    `activation` another gate function by Hugging Face's name (Gemma's GeGLU:
    "gelu_pytorch_tanh"; ModernBERT's: "gelu")."""

    hook_points = ("hook_pre", "hook_pre_linear", "hook_post")

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        bias: bool = False,
        activation: str = "silu",
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.activation_name = activation
        self.gate = nn.Linear(dim, hidden_dim, bias=bias, device=device, dtype=dtype)
        self.up = nn.Linear(dim, hidden_dim, bias=bias, device=device, dtype=dtype)
        self.down = nn.Linear(hidden_dim, dim, bias=bias, device=device, dtype=dtype)
        self.act = F.silu if activation in ("silu", "swish") else _activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        hooks = hooks_for(self)
        if hooks is None:  # (packed gate and up: one kernel call, modules.quantized)
            if self.act is F.silu:  # (a decoding step's packed row: SiLU and product in C)
                h = silu_pair(self.gate, self.up, x)
                if h is not None:
                    return linear(self._modules["down"], h)  # type: ignore[arg-type]
            gate, up = linear_pair(self.gate, self.up, x)
            return linear(self._modules["down"], self.act(gate) * up)  # type: ignore[arg-type]
        gate = hooks("hook_pre", self.gate(x))
        up = hooks("hook_pre_linear", self.up(x))
        return self.down(hooks("hook_post", self.act(gate) * up))
