"""How checkpoints load: dtype and device, sharded safetensors and pytorch_model.bin, both
spellings of RoPE settings, and one clear error for each bad configuration or weight, raised
before anything large is allocated."""

import json
import resource

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers_llama import VOCAB, load_hf, save_causal
from multihead.pretrained import load_causal_lm

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    save_causal(path, "llama-head-dim-biases")
    return path


def copy_with(src, dst, *, config=None, weights=None, drop=()):
    """A copy of model directory `src` with config fields and tensors changed."""
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(config or {})
    for key in drop:
        cfg.pop(key, None)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "model.safetensors")
    tensors.update(weights or {})
    save_file(tensors, dst / "model.safetensors")
    return dst


def logits(model, ids):
    with torch.no_grad():
        return model(ids).float()


IDS = torch.arange(2, 2 + 2 * 11).reshape(2, 11) % VOCAB


def test_bf16_weights_stay_bf16_unless_asked(tmp_path):
    hf = save_causal(tmp_path, "qwen2", dtype=torch.bfloat16)
    ours = load_causal_lm(tmp_path)
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    as_fp32 = load_causal_lm(tmp_path, dtype=torch.float32)
    assert {p.dtype for p in as_fp32.parameters()} == {torch.float32}
    for (name, a), b in zip(ours.state_dict().items(), as_fp32.state_dict().values(), strict=True):
        assert torch.equal(a.float(), b), name  # bf16 -> fp32 is exact
    with torch.no_grad():
        ref = hf(IDS).logits.float()
    # bf16 arithmetic: the two implementations round differently; fp32 on bf16 weights is close
    assert float((logits(ours, IDS) - ref).abs().max()) < 0.1
    assert float((logits(as_fp32, IDS) - ref).abs().max()) < 0.1


def test_fp32_checkpoint_in_bf16(llama):
    ours = load_causal_lm(llama, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    assert ours.generate(IDS[:1], 3).shape == (1, 14)
    rope = ours.attention(0).position
    assert rope.inv_freq.dtype == torch.float32  # tables stay fp32


def test_sharded_safetensors_and_pytorch_bin(llama, tmp_path):
    ref = logits(load_causal_lm(llama), IDS)
    save_causal(tmp_path / "shards", "llama-head-dim-biases", max_shard_size="40KB")
    assert len(list((tmp_path / "shards").glob("model-*.safetensors"))) > 2
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    assert torch.equal(logits(load_causal_lm(tmp_path / "shards"), IDS), ref)
    save_causal(tmp_path / "bin", "llama-head-dim-biases", torch_bin=True)
    assert (tmp_path / "bin" / "pytorch_model.bin").is_file()
    assert torch.equal(logits(load_causal_lm(tmp_path / "bin"), IDS), ref)


def test_missing_shard_is_named(tmp_path):
    save_causal(tmp_path, "llama", max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"names a shard that is missing: '{shard.name}'"):
        load_causal_lm(tmp_path)


def test_transformers_4_rope_spelling(tmp_path):
    """rope_theta + rope_scaling at the top level, as transformers 4 wrote config.json."""
    save_causal(tmp_path / "v5", "llama3")
    cfg = json.loads((tmp_path / "v5" / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    theta = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")
    old = copy_with(
        tmp_path / "v5",
        tmp_path / "v4",
        config={"rope_theta": theta, "rope_scaling": params},
        drop=["rope_parameters"],
    )
    a, b = load_causal_lm(tmp_path / "v5"), load_causal_lm(old)
    assert a.config == b.config and b.config.rope_scaling.kind == "llama3"
    with torch.no_grad():
        ref = load_hf(tmp_path / "v5")(IDS).logits
    assert float((logits(b, IDS) - ref).abs().max()) <= 1e-5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_parameters": {"rope_type": "proportional", "factor": 4.0, "rope_theta": 1e4}},
            r"config.json \(llama\): rope_parameters.rope_type 'proportional' is not supported",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 1e4,
                    "short_factor": [1.0],
                }
            },
            "long_factor must be a list of positive numbers",
        ),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, r"lacks factor"),
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 0.5, "rope_theta": 1e4}},
            "factor must be a number >= 1",
        ),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5 is not supported"),
        ({"hidden_act": "gelu"}, r"hidden_act = 'gelu' is not supported; known: silu, swish"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantized weights"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 must divide num_attention_heads 4"),
        ({"head_dim": 15}, "RoPE needs an even head_dim, got 15"),
        ({"rms_norm_eps": 0}, r"rms_norm_eps must be a positive number, got 0"),
        ({"rms_norm_eps": -1e-6}, r"rms_norm_eps must be a positive number"),
        ({"num_hidden_layers": 0}, r"num_hidden_layers must be a positive int, got 0"),
        ({"vocab_size": -5}, r"vocab_size must be a positive int, got -5"),
        ({"intermediate_size": 40.5}, r"intermediate_size must be a positive int, got 40.5"),
        ({"attention_dropout": 1.0}, r"attention_dropout must be in \[0, 1\)"),
        (
            {"model_type": "mamba"},
            r"unsupported architecture: model_type 'mamba' .*reads model_type 'gpt2', 'llama', 'mistral', 'qwen2', 'gpt_neox', 'phi3', 'gemma'",
        ),
    ],
)
def test_bad_config_is_refused_by_name(llama, tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        load_causal_lm(copy_with(llama, tmp_path / "m", config=change))


def test_qwen2_layer_types_are_checked(tmp_path):
    save_causal(tmp_path, "qwen2-window")
    bad = copy_with(
        tmp_path, tmp_path / "bad", config={"layer_types": ["full_attention", "chunked"]}
    )
    with pytest.raises(ValueError, match="layer_types must list 3 entries"):
        load_causal_lm(bad)


def test_huge_vocab_fails_before_allocating(llama, tmp_path):
    """16 million vocabulary rows (the largest size a config may give) would be 3 GB; the header
    check refuses first."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(
        ValueError, match=r"tok.weight: checkpoint \(96, 48\) != model \(16000000, 48\)"
    ):
        load_causal_lm(copy_with(llama, tmp_path / "m", config={"vocab_size": 16_000_000}))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), r"model.layers.1.mlp.up_proj.weight holds NaN or infinite values"),
        (float("inf"), r"model.layers.1.mlp.up_proj.weight holds NaN or infinite values"),
    ],
)
def test_non_finite_weights_are_refused(llama, tmp_path, value, message):
    w = load_file(llama / "model.safetensors")["model.layers.1.mlp.up_proj.weight"].clone()
    w[3, 4] = value
    with pytest.raises(ValueError, match=message):
        load_causal_lm(
            copy_with(llama, tmp_path / "m", weights={"model.layers.1.mlp.up_proj.weight": w})
        )


def test_overflow_on_conversion_is_refused(llama, tmp_path):
    w = load_file(llama / "model.safetensors")["model.norm.weight"].clone()
    w[0] = 1e6  # beyond float16's range
    path = copy_with(llama, tmp_path / "m", weights={"model.norm.weight": w})
    with pytest.raises(ValueError, match="after conversion to float16"):
        load_causal_lm(path, dtype=torch.float16)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.uint8])
def test_integer_and_boolean_weights_are_refused(llama, tmp_path, dtype):
    w = torch.zeros(48, dtype=dtype)
    path = copy_with(llama, tmp_path / "m", weights={"model.norm.weight": w})
    with pytest.raises(ValueError, match=r"integer, boolean or quantized .*model.norm.weight"):
        load_causal_lm(path)


def test_bad_dtype_and_device_arguments(llama):
    with pytest.raises(TypeError, match=r"dtype must be None or a floating torch\.dtype"):
        load_causal_lm(llama, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"dtype must be None or a floating torch\.dtype"):
        load_causal_lm(llama, dtype="float16")
    with pytest.raises(ValueError, match="device='meta' holds no weights"):
        load_causal_lm(llama, device="meta")
    with pytest.raises(ValueError, match="device must name a torch device"):
        load_causal_lm(llama, device="nowhere")


def test_corrupted_safetensors_header(llama, tmp_path):
    path = copy_with(llama, tmp_path / "m")
    data = bytearray((path / "model.safetensors").read_bytes())
    (path / "model.safetensors").write_bytes(data[: len(data) - 100])  # the last tensor cut
    with pytest.raises(ValueError, match="corrupted or truncated"):
        load_causal_lm(path)
    n = int.from_bytes(data[:8], "little")
    data[8 : 8 + n] = b"{" + b" " * (n - 1)
    (path / "model.safetensors").write_bytes(data)
    with pytest.raises(ValueError, match="header is not JSON"):
        load_causal_lm(path)


MEASURE = """
import resource, sys, torch
from multihead.pretrained import load_causal_lm
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
load_causal_lm(sys.argv[1])  # warm-up: one-time costs (imports, first use of ops)
before = peak()
model = load_causal_lm(sys.argv[2], dtype=getattr(torch, sys.argv[3]))
print(peak() - before)
"""


def write_llama(path, *, dim=512, layers=2, vocab=8192, ffn=1536):
    """A Llama checkpoint written with safetensors directly (no transformers model in RAM)."""
    path.mkdir()
    config = dict(
        model_type="llama",
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=8,
        max_position_embeddings=256,
    )
    (path / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(0)
    w = {
        "model.embed_tokens.weight": torch.randn(vocab, dim, generator=g),
        "lm_head.weight": torch.randn(vocab, dim, generator=g),
        "model.norm.weight": torch.ones(dim),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in "qkvo":
            w[f"{p}self_attn.{n}_proj.weight"] = torch.randn(dim, dim, generator=g)
        for n, shape in (("gate", (ffn, dim)), ("up", (ffn, dim)), ("down", (dim, ffn))):
            w[f"{p}mlp.{n}_proj.weight"] = torch.randn(*shape, generator=g)
        w[f"{p}input_layernorm.weight"] = torch.ones(dim)
        w[f"{p}post_attention_layernorm.weight"] = torch.ones(dim)
    save_file(w, path / "model.safetensors")
    return path


def test_peak_memory_is_the_checkpoint_not_twice(llama, tmp_path):
    """Peak RSS of loading a 60 MiB fp32 checkpoint, in a fresh process: the weights once (plus
    allocator slack), not random weights plus a copy (that would be 2x)."""
    import subprocess
    import sys

    path = write_llama(tmp_path / "big")
    size = (path / "model.safetensors").stat().st_size
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(llama), str(path), "float32"],
        capture_output=True,
        text=True,
        check=True,
    )
    grown = int(run.stdout.split()[-1])
    assert grown < 1.15 * size, f"peak grew {grown / 2**20:.1f} MiB for {size / 2**20:.1f} MiB"


def test_qwen2_windows_from_max_window_layers(tmp_path):
    """Configs older than layer_types: the window applies from max_window_layers on."""
    save_causal(tmp_path / "new", "qwen2-window")
    cfg = json.loads((tmp_path / "new" / "config.json").read_text())
    assert cfg["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    old = copy_with(tmp_path / "new", tmp_path / "old", drop=["layer_types"])
    a, b = load_causal_lm(tmp_path / "new"), load_causal_lm(old)
    assert a.config == b.config and b.config.full_attention_layers == (0,)
    off = copy_with(old, tmp_path / "off", config={"use_sliding_window": False})
    assert load_causal_lm(off).config.sliding_window is None


def test_key_mismatches_are_named(llama, tmp_path):
    weights = load_file(llama / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.bias"]
    weights["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    weights["model.layers.0.self_attn.k_proj.weight"] = torch.ones(32, 47)
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text((llama / "config.json").read_text())
    save_file(weights, path / "model.safetensors")
    with pytest.raises(ValueError) as err:
        load_causal_lm(path)
    message = str(err.value)
    assert "missing from the checkpoint: layers.1.mlp.down_proj.bias" in message
    assert "unexpected in the checkpoint: model.layers.0.self_attn.q_norm.weight" in message
    assert "layers.0.attn.in_proj.weight: sources of shapes (64, 48), (32, 47), (32, 48)" in message
