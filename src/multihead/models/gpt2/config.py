"""GPT-2's config.json (Hugging Face GPT2Config) -> LMConfig; flags multihead does not
implement are refused by name."""

from __future__ import annotations

from ...modules.feedforward import ACTIVATIONS
from ...modules.lm import LMConfig
from ..fields import Fields


def gpt2_config(config: dict) -> LMConfig:
    f = Fields(config, "gpt2")
    f.refuse(
        "scale_attn_by_inverse_layer_idx",
        lambda v: v is False,
        "it divides layer i's attention scores by i + 1, which multihead does not implement",
    )
    f.refuse(
        "reorder_and_upcast_attn",
        lambda v: v is False,
        "the upcast attention variant is not implemented",
    )
    f.refuse(
        "scale_attn_weights",
        lambda v: v is True,
        "attention without the 1/sqrt(head_dim) scale is not implemented",
    )
    f.refuse("add_cross_attention", lambda v: v is False, "GPT-2 with cross-attention")
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    dim, heads = f.int("n_embd"), f.int("n_head")
    if dim % heads:
        raise ValueError(f"config.json (gpt2): n_embd {dim} is not divisible by n_head {heads}")
    resid, embd = f.probability("resid_pdrop"), f.probability("embd_pdrop")
    if resid != embd:  # CausalLM applies one dropout rate to embeddings and residual branches
        raise ValueError(
            f"config.json (gpt2): resid_pdrop {resid} != embd_pdrop {embd} is not supported"
        )
    return LMConfig(
        vocab_size=f.int("vocab_size"),
        dim=dim,
        num_layers=f.int("n_layer"),
        num_heads=heads,
        ffn_dim=f.int("n_inner", None) or 4 * dim,
        max_positions=f.int("n_positions"),
        norm_eps=f.epsilon("layer_norm_epsilon", 1e-5),
        activation=f.choice("activation_function", "gelu_new", ACTIVATIONS),
        tie_embeddings=f.flag("tie_word_embeddings", True),
        dropout=resid,
        attn_dropout=f.probability("attn_pdrop"),
    )
