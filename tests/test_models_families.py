"""The native Gemma 1-3, Qwen3 and OLMo 2 families against transformers' eager fp32 run of the
same tiny random checkpoint (tests/helpers_families_core.py): from a directory, the Hugging Face
cache and llama.cpp-converted GGUF files (f32 and q8_0, tests/fixtures/families/, written by
tools/make_family_fixtures.py); attention patterns against output_attentions; every family
mechanism shown to change the logits; bad configs and files refused by name."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

import multihead
from helpers_families_core import FAMILIES, FIXTURES, build, load_hf, token_ids
from multihead.models.gguf import load_gguf_causal_lm
from multihead.modules.lm import CausalLM

ATOL = 1e-4  # logits, fp32, against transformers


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    """(family, directory, transformers model, ids, its eager outputs)."""
    family = request.param
    directory = tmp_path_factory.mktemp(family) / "model"
    hf = build(family, directory, seed=3)
    ids = token_ids(hf.config.vocab_size)
    with torch.no_grad():
        out = hf(ids, output_attentions=True)
    return family, directory, hf, ids, out


def test_directory_logits_and_patterns(checkpoint):
    _, directory, _, ids, want = checkpoint
    model = multihead.load(str(directory))
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
    torch.testing.assert_close(logits, want.logits, atol=ATOL, rtol=0)
    for i, pattern in enumerate(want.attentions):
        torch.testing.assert_close(
            cache[f"blocks.{i}.attn.hook_pattern"], pattern, atol=1e-5, rtol=0
        )


def test_hf_cache(checkpoint, tmp_path, monkeypatch):
    family, directory, _, ids, want = checkpoint
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hub" / f"models--org--tiny-{family}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(directory, root / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with torch.no_grad():
        logits = multihead.load(f"org/tiny-{family}")(ids)
    torch.testing.assert_close(logits, want.logits, atol=ATOL, rtol=0)


# LMConfig field -> the value that switches the mechanism off
NEUTRAL = {
    "attn_softcap": None,
    "final_softcap": None,
    "attn_scale": None,
    "local_rope_theta": None,
    "norm_offset": 0.0,
    "embed_scale": False,
    "sliding_window": None,
    "qk_norm": None,
    "branch_norms": "pre",
}
MECHANISMS = {
    "gemma": {"norm_offset", "embed_scale"},
    "gemma2": {"attn_softcap", "final_softcap", "attn_scale", "norm_offset", "embed_scale",
               "sliding_window", "branch_norms"},
    "gemma3": {"final_softcap", "attn_scale", "local_rope_theta", "norm_offset", "embed_scale",
               "sliding_window", "qk_norm", "branch_norms"},
    "qwen3": {"sliding_window", "qk_norm"},
    "olmo2": {"qk_norm", "branch_norms"},
}  # fmt: skip


def test_every_mechanism_shows_in_the_logits(checkpoint):
    """The checkpoint is sensitive to each of its family's mechanisms: switching one off
    moves the logits far past the tolerance (so the equality above tests each of them)."""
    family, directory, _, ids, want = checkpoint
    model = multihead.load(str(directory))
    on = {k for k, off in NEUTRAL.items() if getattr(model.config, k) != off}
    assert on == MECHANISMS[family]
    for key in sorted(on):
        other = CausalLM(dataclasses.replace(model.config, **{key: NEUTRAL[key]}), init=False)
        other.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            moved = (other(ids) - want.logits).abs().max()
        assert moved > 100 * ATOL, (key, moved)


def test_kv_cache_decoding_equals_the_full_forward(checkpoint):
    """Per-layer windows, local RoPE bases and q/k norms through the KV cache, token by token."""
    _, directory, _, ids, want = checkpoint
    model = multihead.load(str(directory))
    caches = model.make_caches(ids.shape[0])
    with torch.no_grad():
        steps = [model(ids[:, :5], caches=caches)]
        steps += [model(ids[:, t : t + 1], caches=caches) for t in range(5, ids.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), want.logits, atol=ATOL, rtol=0)


def _gguf_reference(family, quantised: bool = False):
    """Ids and transformers' logits for the fixture's checkpoint; `quantised`: with every
    matrix the converter stores as q8_0 rounded through gguf-py's own Q8_0 quantiser and
    dequantiser (llama.cpp's reference Python code; multihead dequantises Q8_0 in torch)."""
    import gguf
    import numpy as np

    hf = load_hf(FIXTURES / family / "hf")
    ids = token_ids(hf.config.vocab_size)
    with torch.no_grad():
        if quantised:
            q8 = gguf.GGMLQuantizationType.Q8_0
            for p in hf.parameters():
                if p.dim() == 2 and p.shape[1] % 32 == 0:  # (the converter's rule for q8_0)
                    rows = gguf.quants.quantize(p.numpy().astype(np.float32), q8)
                    p.copy_(torch.from_numpy(gguf.quants.dequantize(rows, q8)).view(p.shape))
        return ids, hf(ids).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_f32_and_q8_0(family):
    ids, want = _gguf_reference(family)
    f32 = load_gguf_causal_lm(FIXTURES / family / "f32.gguf")
    q8 = load_gguf_causal_lm(FIXTURES / family / "q8_0.gguf")
    with torch.no_grad():
        torch.testing.assert_close(f32(ids), want, atol=ATOL, rtol=0)
        got = q8(ids)
    # q8_0: exactly the checkpoint with its matrices quantised, so within quantisation error
    _, quantised = _gguf_reference(family, quantised=True)
    torch.testing.assert_close(got, quantised, atol=ATOL, rtol=0)
    error = (got - want).abs().max()
    assert 0 < error < 0.05 * want.abs().max()
    assert torch.equal(got.argmax(-1), quantised.argmax(-1))
    # against the float weights: the same argmax wherever the top two logits are further
    # apart than twice that position's quantisation error
    top2 = want.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * (got - want).abs().amax(-1)
    assert clear.float().mean() > 0.5
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


@pytest.mark.parametrize("family", ["qwen3", "olmo2"])
def test_gguf_bpe_tokenizer_matches_the_directory(family):
    from transformers import AutoTokenizer

    model = load_gguf_causal_lm(FIXTURES / family / "f32.gguf")
    reference = AutoTokenizer.from_pretrained(FIXTURES / family / "hf")
    text = "The lazy fox reads keys:  values\n\n(0 1 2) attention!"
    assert model.tokenizer is not None
    assert model.to_tokens(text, prepend_bos=False)[0].tolist() == reference(text)["input_ids"]


GEMMA_TEXTS = [
    "The lazy fox",
    " leading space",
    "  two leading and trailing  ",
    "a  b   c\n\n d",  # whitespace runs; "\n" is outside this vocabulary: <unk>
    "h\u00e9llo w\u00f6rld \u65e5\u672c \U0001f642",  # unknown characters, fused runs of them
    "<bos>x<eos><start_of_turn>",  # control tokens whole, an unknown name in pieces
]


@pytest.mark.parametrize("family", ["gemma", "gemma2", "gemma3"])
def test_gguf_sentencepiece_tokenizer_matches_the_directory(family):
    """Gemma's SentencePiece vocabulary in GGUF (no dummy prefix, no byte pieces, no
    unknown_token_id key): the same ids as transformers' tokenizer of the source directory."""
    from transformers import AutoTokenizer

    model = multihead.load(str(FIXTURES / family / "f32.gguf"))
    reference = AutoTokenizer.from_pretrained(FIXTURES / family / "hf")
    assert model.tokenizer is not None
    for text in GEMMA_TEXTS:
        assert model.to_tokens(text)[0].tolist() == reference(text)["input_ids"], text
        bare = reference(text, add_special_tokens=False)["input_ids"]
        assert model.to_tokens(text, prepend_bos=False)[0].tolist() == bare, text
    assert reference.unk_token_id in model.to_tokens(GEMMA_TEXTS[4])[0].tolist()


# -- bad input ------------------------------------------------------------------------------


def _config(directory) -> dict:
    return json.loads((directory / "config.json").read_text())


@pytest.mark.parametrize(
    ("family", "key", "value", "owner"),
    [
        ("gemma", "attn_logit_softcapping", 50.0, "gemma2"),
        ("gemma2", "rope_local_base_freq", 10000.0, "gemma3_text"),
        ("qwen3", "query_pre_attn_scalar", 256, "gemma2"),
        ("olmo2", "use_parallel_residual", True, "gpt_neox"),
    ],
)
def test_config_mixing_two_families_is_refused(tmp_path, family, key, value, owner):
    shutil.copytree(FIXTURES / family / "hf", tmp_path / "m")
    config = _config(tmp_path / "m") | {key: value}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    model_type = config["model_type"]
    with pytest.raises(ValueError) as e:
        multihead.load(str(tmp_path / "m"))
    message = str(e.value)
    assert f"config.json ({model_type}): {key}" in message and f"a {owner} setting" in message
    assert f"expected: no {key}" in message


def test_gguf_metadata_contradicting_its_tensors_is_refused(tmp_path):
    """A GGUF whose head_count_kv says 4 over k/v tensors made for 2: one error naming the
    file, the tensor and the shapes, before any weight is read."""
    import gguf

    source = gguf.GGUFReader(FIXTURES / "gemma2" / "f32.gguf")
    path = tmp_path / "bad.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma2")
    for field in source.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == "gemma2.attention.head_count_kv":
            value = 4
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, kind, sub_type=sub)
    for t in source.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError) as e:
        load_gguf_causal_lm(path)
    message = str(e.value)
    assert message.startswith(f"{str(path)!r}: GGUF metadata contradicts tensor blk.0.attn_k")
    assert "gemma2.attention.head_count_kv = 4" in message and "expect shape (32, 32)" in message


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3"])  # (attention soft-capping: test_attention_variants)
def test_compile_fullgraph_one_graph_for_every_length(family, tmp_path):
    """Final soft-cap, per-layer windows and RoPE bases, q/k norms and post-norms trace: one graph
    (dynamo's CompileCounter backend) for every length, equal to eager."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    build(family, tmp_path / "m")
    config = multihead.load(str(tmp_path / "m")).config
    # two of its layers (one windowed with the local RoPE base, one full): tracing is per layer
    config = dataclasses.replace(config, num_layers=2, full_attention_layers=(1,))
    torch.manual_seed(0)
    model = CausalLM(config).eval()
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for T in (7, 11, 13):
            ids = torch.randint(0, model.config.vocab_size, (2, T))
            torch.testing.assert_close(compiled(ids), model(ids))
    assert counter.frame_count == 1


def _tensor_parallel_refuses(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from multihead.modules import CausalLM as LM
    from multihead.modules import LMConfig
    from multihead.parallel import tensor_parallel

    config = LMConfig(vocab_size=37, dim=24, num_layers=1, num_heads=4, ffn_dim=16,
                      position="rope", norm="rmsnorm", qk_norm="width", branch_norms="post")  # fmt: skip
    mesh = init_device_mesh("cpu", (world,))
    try:
        tensor_parallel(LM(config).eval(), mesh)
    except ValueError as e:
        assert "HeadParallel does not shard a q/k norm over the width" in str(e), str(e)
        return
    raise AssertionError("OLMo 2's width-wise q/k norm was sharded by heads")


@pytest.mark.slow  # (a spawned one-rank gloo world)
def test_tensor_parallel_refuses_what_it_cannot_split():
    from helpers_parallel import run_world

    run_world(_tensor_parallel_refuses, 1)


def test_windowed_layers_rotate_the_same_part_of_each_head():
    """A partial rotary (rotary_dim, GPT-NeoX / Phi-3) holds in the windowed layers that rotate
    with their own base (local_rope_theta, Gemma 3): with that base equal to the global one,
    the model is the one without a local base."""
    from multihead.modules import CausalLM as LM
    from multihead.modules import LMConfig

    base = LMConfig(vocab_size=37, dim=32, num_layers=2, num_heads=2, ffn_dim=16,
                    position="rope", rope_theta=100.0, rotary_dim=8, sliding_window=3,
                    full_attention_layers=(1,), norm="rmsnorm", mlp="swiglu", bias=False)  # fmt: skip
    torch.manual_seed(0)
    plain = LM(base).eval()
    local = LM(dataclasses.replace(base, local_rope_theta=100.0)).eval()
    local.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 37, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(local(ids), plain(ids))
