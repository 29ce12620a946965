"""GGUF loading on tiny files written as llama.cpp writes them (tests/helpers_gguf.py), against
the Hugging Face model they were written from and against transformers' own GGUF loading."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

import multihead
from helpers_gguf import ARCHITECTURES, QUANTISABLE, VOCAB, hf_model, transformers_gguf, write_gguf
from multihead.models import load_causal_lm
from multihead.models.gguf import GGUFFile
from multihead.models.gguf.dequant import dequantize

IDS = torch.tensor([[5, 17, 3, 88, 41, 0, 60], [9, 9, 70, 2, 33, 95, 12]])  # (B=2, T=7)


def logits(model, ids=IDS):
    with torch.no_grad():
        out = model(ids)
    return getattr(out, "logits", out)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_float32_file_equals_the_model_it_was_written_from(tmp_path, arch):
    # independent of any GGUF reader: undoing llama.cpp's q/k permutation (Llama, Mistral) and
    # GPT-2's transposes must give back the original model's computation
    model = write_gguf(tmp_path / "m.gguf", arch, "F32")
    ours = load_causal_lm(tmp_path / "m.gguf")
    assert ours.config.num_layers == 2 and ours.config.num_heads == 4
    torch.testing.assert_close(logits(ours), logits(model), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("qtype", QUANTISABLE)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])  # transformers reads no "mistral"
def test_each_quantisation_equals_transformers_gguf_loading(tmp_path, arch, qtype):
    path = tmp_path / f"{arch}-{qtype}.gguf"
    write_gguf(path, arch, qtype)
    reference = transformers_gguf(path)
    ours = load_causal_lm(path, dtype=torch.float32)
    torch.testing.assert_close(logits(ours), logits(reference), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_requested_dtype_is_the_float32_values_rounded_once(tmp_path, dtype):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q4_1")
    # the dequantised model (quantized=False): every weight rounded once from float32
    full = load_causal_lm(path, dtype=torch.float32, quantized=False).state_dict()
    low = load_causal_lm(path, dtype=dtype, quantized=False).state_dict()
    for key, value in full.items():
        if value.is_floating_point() and key in low:
            assert low[key].dtype == dtype or not low[key].is_floating_point(), key
            assert torch.equal(low[key], value.to(dtype)), key
    # packed (the default): the file's blocks kept as stored, the weights seen in `dtype`
    packed = load_causal_lm(path, dtype=dtype)
    assert packed.layers[0].attn.in_proj.weight.dtype == dtype
    assert packed.tok.weight.dtype == dtype
    torch.testing.assert_close(packed.tok.weight, full["tok.weight"].to(dtype), atol=0, rtol=0)


def test_default_dtype_is_float32_for_quantised_and_stored_for_float_files(tmp_path):
    write_gguf(tmp_path / "q.gguf", "llama", "Q8_0")
    write_gguf(tmp_path / "h.gguf", "llama", "F16")
    assert load_causal_lm(tmp_path / "q.gguf").tok.weight.dtype == torch.float32
    assert load_causal_lm(tmp_path / "h.gguf").tok.weight.dtype == torch.float16


def test_multihead_load_picks_the_causal_lm_and_carries_the_tokenizer(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "qwen2", "Q8_0")
    model = multihead.load(str(path))
    assert type(model).__name__ == "CausalLM"
    tok = model.tokenizer
    assert tok is not None and tok.bos_id == VOCAB - 1 and tok.eos_id == VOCAB - 1
    # the merges apply ("a b" then "ab c"), and the control token stays whole
    assert tok.tokenizer.encode("abc<|end|>", add_special_tokens=False).ids == [94, 95]


def test_file_without_tokenizer_loads_with_none(tmp_path):
    write_gguf(tmp_path / "m.gguf", "llama", "F32", tokenizer=None)
    assert load_causal_lm(tmp_path / "m.gguf").tokenizer is None


def test_reader_agrees_with_gguf_reader(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q4_1")
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        expected = field.contents()
        got = ours.metadata[key]
        assert got == pytest.approx(expected) if isinstance(got, float) else got == expected, key
    assert set(ours.tensors) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.qtype == t.tensor_type and mine.shape == tuple(reversed(t.shape.tolist()))
        raw = np.empty(mine.nbytes, dtype=np.uint8)
        ours.read_bytes(mine, raw)
        assert np.array_equal(raw, np.asarray(t.data).reshape(-1).view(np.uint8)), t.name
    ours.close()


# per K-quant type: byte ranges holding f16 scales (d, dmin) in each block, set to sane values
# so that random bytes elsewhere make a valid block (gguf.quants cannot quantise these types)
K_SCALES = {
    Q.Q2_K: (80, 84),
    Q.Q3_K: (108, 110),
    Q.Q4_K: (0, 4),
    Q.Q5_K: (0, 4),
    Q.Q6_K: (208, 210),
}


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, *K_SCALES])
def test_dequantise_equals_gguf_dequantiser(qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 3, 2 * max(block, 256)  # (3, 512): mutually distinct from the block count
    rng = np.random.default_rng(0)
    if qtype in K_SCALES:
        raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
        lo, hi = K_SCALES[qtype]
        scales = rng.uniform(0.01, 0.1, (raw.shape[0], (hi - lo) // 2)).astype(np.float16)
        raw[:, lo:hi] = scales.view(np.uint8)
        raw = raw.reshape(-1)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((rows, cols), np.float32), qtype)
        raw = raw.reshape(-1)
    expected = gguf.quants.dequantize(raw.reshape(rows, -1), qtype)
    got = dequantize(raw, qtype, (rows, cols))
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    assert np.isfinite(expected).all()
    assert np.array_equal(got.numpy(), expected)


def test_hf_model_helper_is_random_but_reproducible():
    a, b = hf_model("llama"), hf_model("llama")
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
