"""`BridgedModel`: what `wrap(model)` returns, an `nn.Module` holding a transformers model that
runs multihead's attention and shows multihead's hook points.

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
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..hook_points import hooks_for
from ..hooked.logit_readout import LogitReadout
from .discover import Stack, final_norm

MARK = "_multihead_bridged"


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
        (`hooked.logit_readout.LogitReadout`). The norm's kind, effective weight and bias are
        measured by probing it (Gemma's (1 + w) included); its eps is read from the module.
        DLA then checks that the components add up to the logit (`check_sum`)."""
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
