"""Tiny random transformers models of many architectures, for the bridge's tests and benchmark
(hidden 32-64, 2 layers; built from configs, nothing downloaded)."""

from __future__ import annotations

from typing import Any

import torch

COMMON: dict[str, Any] = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
)
GQA = dict(num_key_value_heads=2)

# name -> (config class name, model class name, config overrides)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {**GQA}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**GQA, "sliding_window": 4}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {**GQA}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**GQA, "head_dim": 8}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {"clip_qkv": 2.0}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {**GQA}),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        {"ffn_dim": 48, "word_embed_proj_dim": 32, "enable_bias": True},
    ),
    "phi": ("PhiConfig", "PhiForCausalLM", {**GQA, "partial_rotary_factor": 0.5}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**GQA}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {**GQA, "use_qk_norm": False}),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        {**GQA, "attention_multiplier": 0.3, "residual_multiplier": 0.5, "logits_scaling": 2.0},
    ),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"rotary_pct": 0.5}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {**GQA}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {**GQA, "head_dim": 8}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            **GQA,
            "head_dim": 8,
            "sliding_window": 4,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 3.0,
            "query_pre_attn_scalar": 6,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            **GQA,
            "head_dim": 8,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**GQA, "sliding_window": 4}),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            **GQA,
            "head_dim": 8,
            "sliding_window": 4,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {**GQA, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **GQA,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16,
        },
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            **GQA,
            "head_dim": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
        },
    ),
}

# Architectures that do not call transformers' attention registry (refused by the bridge)
UNREGISTERED: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bloom": ("BloomConfig", "BloomForCausalLM", {"n_layer": 2, "n_head": 4, "hidden_size": 32}),
    "gpt_neo": (
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        {"num_layers": 2, "num_heads": 4, "hidden_size": 32, "attention_types": [[["global"], 2]]},
    ),
}


def tiny(name: str, *, seed: int = 0, attn: str = "eager", table=None) -> Any:
    """A random tiny model of architecture `name`, in eval mode, fp32."""
    import transformers

    config_cls, model_cls, extra = (table or {**ARCHITECTURES, **UNREGISTERED})[name]
    kwargs = dict(extra) if table is UNREGISTERED or name in UNREGISTERED else {**COMMON, **extra}
    config = getattr(transformers, config_cls)(
        vocab_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, **kwargs
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)._from_config(config, attn_implementation=attn)
    return model.eval()


def tiny_t5(*, seed: int = 0, attn: str = "eager") -> Any:
    import transformers

    config = transformers.T5Config(
        vocab_size=96,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    return transformers.T5ForConditionalGeneration._from_config(
        config, attn_implementation=attn
    ).eval()


WORDS = [f"w{i}" for i in range(92)]  # ids 4..95 after the four special tokens


def tiny_tokenizer() -> Any:
    """A word-level transformers tokenizer over the tiny models' 96 ids: <pad> 0, <s> 1 (BOS,
    put first), </s> 2, <unk> 3, then w0 .. w91."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )  # fmt: skip


def save_tiny(path: Any, name: str = "starcoder2") -> Any:
    """A saved tiny checkpoint (config.json, model.safetensors) with its tokenizer files."""
    model = tiny(name)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path
