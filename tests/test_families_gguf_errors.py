"""GGUF files whose RoPE factor tensors contradict their metadata or model: one error naming
the file and what is wrong, before any weight is read (files written in llama.cpp's layout by
helpers_gguf; the converter's own files are in test_families_llama_cpp.py)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers_gguf import DIM, HEADS, write_gguf
from multihead.models import load_causal_lm

HALF = DIM // HEADS // 2  # rotated pairs per head


def refused(path, *fragments):
    with pytest.raises(ValueError) as e:
        load_causal_lm(path)
    message = str(e.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_rope_freqs_are_read_and_checked(tmp_path):
    path = tmp_path / "freqs.gguf"

    def factors(values):
        def edit(writer, tensors):
            tensors["rope_freqs.weight"] = np.asarray(values, dtype=np.float32)

        return edit

    write_gguf(path, "llama", edit=factors([1.0] * (HALF - 2) + [4.0, 8.0]))
    rope = load_causal_lm(path).attention(0).position
    assert rope.scaling.kind == "factors" and rope.scaling.short_factor[-1] == 8.0
    write_gguf(path, "llama", edit=factors([1.0] * (HALF + 1)))
    refused(path, f"short_factor holds {HALF + 1} numbers, the rotated width {2 * HALF} needs")
    write_gguf(path, "llama", edit=factors([1.0] * (HALF - 1) + [-2.0]))
    refused(path, "positive numbers")


def test_longrope_factors_need_both_tensors(tmp_path):
    path = tmp_path / "long.gguf"

    def only_long(writer, tensors):
        tensors["rope_factors_long.weight"] = np.ones(HALF, dtype=np.float32)

    write_gguf(path, "llama", edit=only_long)
    refused(path, "rope_factors_long.weight without its pair")

    def type_without_tensors(writer, tensors):
        writer.add_string("llama.rope.scaling.type", "longrope")

    write_gguf(path, "llama", edit=type_without_tensors)
    refused(path, "'longrope' without the tensors rope_factors_long.weight")


def test_rope_freqs_beside_a_scaling_type_is_refused(tmp_path):
    path = tmp_path / "both.gguf"

    def both(writer, tensors):
        writer.add_string("llama.rope.scaling.type", "linear")
        writer.add_float32("llama.rope.scaling.factor", 2.0)
        tensors["rope_freqs.weight"] = np.ones(HALF, dtype=np.float32)

    write_gguf(path, "llama", edit=both)
    refused(path, "both rope_freqs.weight and llama.rope.scaling.type")


@pytest.mark.parametrize(
    ("model_type", "change", "message"),
    [
        ("gpt_neox", {"rms_norm_eps": 1e-6}, "rms_norm_eps = 1e-06 is not supported"),
        ("gpt_neox", {"num_key_value_heads": 1}, "num_key_value_heads = 1 is not supported"),
        ("gpt_neox", {"rotary_pct": 0.5, "partial_rotary_factor": 0.25}, "disagree"),
        ("gpt_neox", {"rotary_pct": 0.125}, "rotates 1 values; RoPE needs an even number"),
        ("phi3", {"use_parallel_residual": True}, "use_parallel_residual = True"),
        ("llama", {"rotary_pct": 0.5}, "rotary_pct = 0.5 is not supported"),
    ],
)
def test_configs_mixing_families_are_refused_by_key(model_type, change, message):
    from multihead.models.families import CAUSAL_LM_FAMILIES

    base = {"model_type": model_type, "vocab_size": 32, "hidden_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 24}  # fmt: skip
    with pytest.raises(ValueError, match=message) as e:
        CAUSAL_LM_FAMILIES[model_type].read_config(base | change)
    assert f"config.json ({model_type})" in str(e.value)
