"""config.json of OLMo 2 checkpoints (Hugging Face Olmo2ForCausalLM) -> LMConfig.

Llama's layout except where the norms sit: no norm before attention or the MLP; an RMSNorm of
each branch's output before it joins the stream (post_attention_layernorm,
post_feedforward_layernorm), and RMSNorms of q and k over their whole projection width (heads *
head_dim, before heads are split). Biases on q/k/v/o with attention_bias. Defaults follow
transformers 5's Olmo2Config.
"""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..decoder_fields import decoder_sizes, refuse_foreign_keys, rope
from ..fields import Fields


def olmo2_config(config: dict) -> LMConfig:
    f = Fields(config, "olmo2")
    refuse_foreign_keys(f)
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    f.refuse("sliding_window", lambda v: v is None, "a sliding window (OLMo 3) is not read")
    f.choice("hidden_act", "silu", ("silu", "swish"))
    sizes = decoder_sizes(f, None, 2048)
    sizes["norm_eps"] = f.epsilon("rms_norm_eps", 1e-5)
    bias = f.flag("attention_bias", False)
    return LMConfig(
        **sizes,
        **rope(f, None, sizes["max_positions"]),
        mlp="swiglu",
        activation="silu",
        tie_embeddings=f.flag("tie_word_embeddings", False),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=False,
        branch_norms="post",
        qk_norm="width",
    )
