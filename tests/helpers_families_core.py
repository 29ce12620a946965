"""Tiny random Gemma 1-3, Qwen3 and OLMo 2 checkpoints saved by Hugging Face `transformers`
(fp32, fixed seeds), with every mechanism of the family bound in the logits: soft-caps small
enough to clip, windows shorter than the test sequence, query_pre_attn_scalar != head_dim,
per-layer RoPE bases far apart, norm weights far from 0 and 1.

Two variants per family: "dir" (what a config.json can say; the tests build it at test time)
and "gguf" (what llama.cpp's converter and reader express: no query_pre_attn_scalar, Gemma 3's
default window pattern and local RoPE base, Qwen3 without a window). The committed fixtures in
tests/fixtures/families/ are the "gguf" variant, written by tools/make_family_fixtures.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("gemma", "gemma2", "gemma3", "qwen3", "olmo2")
FIXTURES = Path(__file__).parent / "fixtures" / "families"
T = 11  # test sequence length: longer than every window below
WINDOW = 4

BASE = dict(
    hidden_size=32,
    intermediate_size=64,  # (a multiple of 32: q8_0 blocks)
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# family -> (model_type, vocab (the fixture tokenizer's size), overrides, "dir" overrides)
CASES: dict[str, tuple[str, int, dict, dict]] = {
    "gemma": ("gemma", 128, dict(num_hidden_layers=2), {}),
    "gemma2": (
        "gemma2",
        128,
        dict(
            num_hidden_layers=3,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=15.0,
            query_pre_attn_scalar=8,  # = head_dim: llama.cpp reads no scalar
        ),
        dict(query_pre_attn_scalar=20),
    ),
    "gemma3": (
        "gemma3_text",
        128,
        dict(
            num_hidden_layers=6,  # llama.cpp's pattern: five windowed layers, then a full one
            sliding_window=WINDOW,
            final_logit_softcapping=15.0,
            query_pre_attn_scalar=8,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 100.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
        dict(
            query_pre_attn_scalar=20,
            layer_types=["sliding_attention", "full_attention"] * 3,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 7.0},
            },
        ),
    ),
    "qwen3": (
        "qwen3",
        288,
        dict(num_hidden_layers=2, attention_bias=True, rope_theta=50.0),
        dict(
            num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
        ),
    ),
    "olmo2": ("olmo2", 288, dict(num_hidden_layers=2, rope_theta=50.0), {}),
}


def hf_config(family: str, variant: str = "dir"):
    import transformers

    model_type, vocab, overrides, extra = CASES[family]
    values = BASE | {"vocab_size": vocab} | overrides | (extra if variant == "dir" else {})
    return transformers.AutoConfig.for_model(model_type, **values)


def randomize(model, seed: int) -> None:
    """Every weight random, at scales where each mechanism shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    offset = "gemma" in model.config.model_type  # (1 + w): w itself far from 0
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key:
                low, high = (0.3, 0.9) if offset else (0.3, 1.7)
                p.copy_(torch.rand(p.shape, generator=g) * (high - low) + low)
            elif "embed" in key:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.25)


def build(family: str, directory: Path | None = None, *, variant: str = "dir", seed: int = 0):
    """A random transformers model (eager attention, fp32, eval), saved to `directory` if
    given."""
    import transformers

    config = hf_config(family, variant)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomize(model, seed)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(directory)
    return model


def load_hf(directory: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager"
    ).eval()


def token_ids(vocab: int, seed: int = 1, batch: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, T), generator=g)
