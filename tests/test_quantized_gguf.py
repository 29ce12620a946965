"""GGUF weights kept packed (multihead.modules.quantized, models/gguf/quantized.py): each
type against gguf's own dequantiser (the independent reference), tiny files of every type gguf
writes (and K-quant files of random blocks), the real SmolLM2 Q4_1 file against its
dequantised load, and bad input."""

from __future__ import annotations

import os
import platform

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

import multihead
from helpers_gguf import (
    HEADS,
    KV_HEADS,
    VOCAB,
    _llama_tensors,
    _metadata,
    add_tokenizer,
    hf_model,
    write_gguf,
)
from multihead.models.gguf import GGUFError, GGUFFile
from multihead.models.gguf.mapped import file_stamp, mapped_bytes
from multihead.models.gguf.quantized import _CONVERT
from multihead.modules.quantized import PackedRows, QuantizedEmbedding, QuantizedLinear, kernels

# byte offsets of the float16 scales (d, dmin) in each K-quant block (ggml-common.h)
K_SCALES = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,)}


def random_blocks(qtype: Q, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes as `rows` x `cols` values of `qtype`, with finite float16 scales."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in K_SCALES[qtype]:
        d = rng.uniform(-0.05, 0.05, (rows, cols // block)).astype(np.float16)
        raw[:, :, at : at + 2] = d[..., None].view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def our_values(qtype: Q, raw: np.ndarray, cols: int) -> torch.Tensor:
    block, size = GGML_QUANT_SIZES[qtype]
    qs, scale, zero, _ = _CONVERT[qtype](raw.reshape(raw.shape[0], cols // block, size))
    qs = torch.from_numpy(np.array(qs, order="C")).reshape(raw.shape[0], -1)
    if qtype == Q.Q8_0:
        return kernels.dequantize_int8(qs, torch.from_numpy(scale))
    zero = None if zero is None else torch.from_numpy(zero)
    return kernels.dequantize_int4(qs, torch.from_numpy(scale), zero)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K])
def test_packed_forms_equal_gguf_dequantiser(qtype):
    rows, cols = 6, 512  # two Q4_K super-blocks per row
    if qtype == Q.Q4_K:
        raw = random_blocks(qtype, rows, cols)
    else:
        values = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
        raw = gguf.quants.quantize(values, qtype)
    expected = gguf.quants.dequantize(raw, qtype).reshape(rows, cols)
    ours = our_values(qtype, raw, cols)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rows", [1, 3, kernels.KERNEL_MAX_ROWS + 1])  # kernel, kernel, GEMM
@pytest.mark.parametrize("no_kernels", [False, True])
@pytest.mark.parametrize("stored", ["float16", "float32", "implicit zero"])
def test_products_against_float64(rows, no_kernels, stored, monkeypatch):
    if no_kernels:
        monkeypatch.setattr(kernels, "_library", lambda extra=(): None)
    _check_products(rows, stored)


def _check_products(rows: int, stored: str) -> None:
    g = torch.Generator().manual_seed(0)
    # 19 groups (the 16-wide scale conversion's masked tail); 43 rows (the one-row path's blocks
    # of 4 rows and a remainder of 3)
    N, K = 43, 96 + 32 * 16
    dtype = torch.float32 if stored == "float32" else torch.float16
    qs = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    scale = torch.rand(N, K // 32, generator=g).to(dtype)
    zero = None if stored == "implicit zero" else torch.randn(N, K // 32, generator=g).to(dtype)
    q8 = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    x = torch.randn(rows, K, generator=g)
    # the reference: the textbook dequantisation in float64
    q = torch.cat((qs.view(N, -1, 16) & 15, qs.view(N, -1, 16) >> 4), -1).double()  # (N, G, 32)
    s = scale.double()[..., None]
    z = -8 * s if zero is None else zero.double()[..., None]
    w4 = (q * s + z).view(N, K)
    w8 = (q8.view(N, -1, 32).double() * s).view(N, K)
    torch.testing.assert_close(kernels.dequantize_int4(qs, scale, zero).double(), w4)
    torch.testing.assert_close(kernels.dequantize_int8(q8, scale).double(), w8)
    for ours, w in ((kernels.int4_mm(x, qs, scale, zero), w4), (kernels.int8_mm(x, q8, scale), w8)):
        expected = x.double() @ w.t()
        atol = 1e-6 * float(expected.abs().max())  # float32 sums of 608 terms
        torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=atol)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 compiler flags")
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")])
def test_avx2_and_scalar_kernels_against_float64(flags, monkeypatch):
    """The kernel compiled without AVX-512 (the AVX2 path) and without AVX2 (the scalar one)."""
    if kernels._library() is None:
        pytest.skip("no C compiler here (the torch path is tested above)")
    lib = kernels._library(flags)
    with open("/proc/cpuinfo") as f:
        avx2 = " avx2 " in f.read().replace("\n", " ")
    assert lib is not None and lib.mh_isa() == (256 if len(flags) == 1 and avx2 else 0)
    monkeypatch.setattr(kernels, "_library", lambda extra=(): lib)
    for stored in ("float16", "float32", "implicit zero"):
        for rows in (1, 3):
            _check_products(rows, stored)


def write_raw_gguf(path, qtype: Q) -> None:
    """A tiny Llama (width 256, as K-quant super-blocks need) whose matrices are random `qtype`
    blocks (gguf has no K-quant quantiser)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    tensors = _llama_tensors("llama", model.state_dict())
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(256 // HEADS)
    add_tokenizer(w)
    for i, (name, value) in enumerate(tensors.items()):
        if value.ndim == 2:
            raw = random_blocks(qtype, value.shape[0], value.shape[1], seed=i)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


WRITABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
RANDOM_K = ["Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K"]
FORM = {"Q4_0": "int4", "Q4_1": "int4", "Q4_K": "int4", "Q8_0": "int8"}


@pytest.mark.parametrize("qtype", WRITABLE + RANDOM_K)
def test_tiny_files_of_each_type(tmp_path, qtype):
    path = tmp_path / f"tiny-{qtype}.gguf"
    if qtype in WRITABLE:
        write_gguf(path, "llama", qtype)
    else:
        write_raw_gguf(path, Q[qtype])
    packed = multihead.load(path)
    plain = multihead.load(path, quantized=False)
    attn = packed.layers[1].attn
    assert isinstance(attn.in_proj, QuantizedLinear) and isinstance(packed.tok, QuantizedEmbedding)
    assert attn.in_proj.packed.form == FORM.get(qtype, "blocks")
    assert attn.in_proj.packed.qtype == qtype
    # the packed q, k, v rows (llama.cpp's rotary permutation undone) dequantise to the
    # dequantised model's weights, value for value
    torch.testing.assert_close(attn.in_proj.weight, plain.layers[1].attn.in_proj.weight)
    torch.testing.assert_close(packed.W_U, plain.W_U)
    ids = torch.tensor([[5, 17, 2, 40, 11, 63, 7], [1, 2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        expected = plain(ids)
        atol = 1e-5 * float(expected.abs().max())  # float32 sums in another order
        torch.testing.assert_close(packed(ids), expected, rtol=1e-4, atol=atol)
        one = packed(ids[:, :1])  # the kernel's row counts (one token) too
        torch.testing.assert_close(one, plain(ids[:, :1]), rtol=1e-4, atol=atol)


STORED = {  # (scale dtype, zero dtype): the file's own float16 values kept as they are
    "Q4_0": (torch.float16, None),  # zero -8 d: implicit, nothing stored
    "Q4_1": (torch.float16, torch.float16),
    "Q8_0": (torch.float16, None),
    "Q4_K": (torch.float32, torch.float32),  # d sc and -dmin mn: products, exact in float32
}


@pytest.mark.parametrize("qtype", list(STORED))
def test_storage_layout_against_gguf_dequantiser(tmp_path, qtype):
    path = tmp_path / f"tiny-{qtype}.gguf"
    if qtype in WRITABLE:
        write_gguf(path, "llama", qtype)
    else:
        write_raw_gguf(path, Q[qtype])
    down = multihead.load(path).layers[0].ffn.down
    packed = down.packed
    scale_dtype, zero_dtype = STORED[qtype]
    assert packed.scale.dtype == scale_dtype
    assert (packed.zero is None) if zero_dtype is None else packed.zero.dtype == zero_dtype
    g = packed.shape[1] // 32
    assert packed.qs.nbytes + packed.scale.nbytes + (packed.zero is None or packed.zero.nbytes) <= (
        packed.shape[0] * g * ({"Q4_K": 16 + 8} | {"Q8_0": 32 + 2}).get(qtype, 16 + 4) + 1
    )
    tensor = GGUFFile(path).tensors["blk.0.ffn_down.weight"]
    raw = np.fromfile(path, np.uint8, tensor.nbytes, offset=tensor.offset)
    expected = gguf.quants.dequantize(raw.reshape(packed.shape[0], -1), Q[qtype])
    np.testing.assert_array_equal(down.weight.numpy(), expected.reshape(packed.shape))
    x = torch.randn(1, packed.shape[1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        down(x).double(), x.double() @ torch.from_numpy(expected).double().t(), rtol=1e-5, atol=1e-5
    )


def test_nan_scale_is_refused_by_name(tmp_path):
    path = tmp_path / "nan.gguf"
    write_gguf(path, "llama", "Q4_0")
    file = GGUFFile(path)
    t = file.tensors["blk.1.ffn_up.weight"]
    data = bytearray(path.read_bytes())
    data[t.offset + 18 * 3 : t.offset + 18 * 3 + 2] = np.array([np.nan], np.float16).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight.*Q4_0.*NaN or infinite"):
        multihead.load(path)


def test_nan_scale_in_file_blocks_is_refused(tmp_path):
    path = tmp_path / "nan6k.gguf"
    write_raw_gguf(path, Q.Q6_K)
    t = GGUFFile(path).tensors["blk.0.attn_v.weight"]
    data = bytearray(path.read_bytes())
    data[t.offset + 208 : t.offset + 210] = np.array([np.inf], np.float16).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"blk\.0\.attn_v\.weight.*Q6_K.*NaN or infinite"):
        multihead.load(path)


def test_type_without_dequantiser_is_refused_by_name(tmp_path):
    path = tmp_path / "q81.gguf"
    # one matrix in Q8_1 (ggml's activation type: gguf has no dequantiser for it)
    model = hf_model("llama")
    tensors = _llama_tensors("llama", model.state_dict())
    w = gguf.GGUFWriter(str(path), "llama")
    _metadata(w, "llama", model)
    for name, value in tensors.items():
        if name == "blk.0.ffn_gate.weight":
            rows, cols = value.shape
            block, size = GGML_QUANT_SIZES[Q.Q8_1]
            raw = np.zeros((rows, cols // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=Q.Q8_1)
        elif value.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(value, Q.Q4_0), raw_dtype=Q.Q4_0)
        else:
            w.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_gate\.weight.*Q8_1"):
        multihead.load(path)


def test_file_changed_under_the_map_is_refused(tmp_path):
    path = tmp_path / "changing.gguf"
    write_gguf(path, "llama", "Q4_1")
    file = GGUFFile(path)
    stamp = file_stamp(path)
    tensor = file.tensors["blk.0.attn_q.weight"]
    with mapped_bytes(file, tensor, stamp) as raw:
        assert raw.nbytes == tensor.nbytes
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten in place
    changed = r"changed while loading.*blk\.0\.attn_q\.weight.*Q4_1"
    with pytest.raises(GGUFError, match=changed), mapped_bytes(file, tensor, stamp):
        pass


# -- the real file --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_plain(smollm2_gguf_path):
    return multihead.load(smollm2_gguf_path, quantized=False)


def test_smollm2_is_packed_and_small(smollm2):
    assert isinstance(smollm2.head, QuantizedLinear) and smollm2.head.packed is smollm2.tok.packed
    assert smollm2.tok.packed.qtype == "Q8_0"
    assert smollm2.layers[0].ffn.down.packed.qtype == "Q4_1"
    stored = sum(b.nbytes for b in smollm2.buffers()) + sum(p.nbytes for p in smollm2.parameters())
    dequantised = (
        sum(
            m.packed.shape[0] * m.packed.shape[1] * 4
            for m in smollm2.modules()
            if isinstance(m, (QuantizedLinear,)) and m is not smollm2.head
        )
        + smollm2.tok.packed.shape[0] * smollm2.tok.packed.shape[1] * 4
    )
    assert stored < 0.25 * dequantised


def test_smollm2_logits_tokens_and_hooks_equal_dequantised(smollm2, smollm2_plain):
    ids = smollm2.to_tokens("The capital of France is Paris, and the capital of Spain is")
    with torch.no_grad():
        torch.testing.assert_close(smollm2(ids), smollm2_plain(ids), rtol=0, atol=2e-3)
    greedy = smollm2.generate(ids, 8)
    assert torch.equal(greedy, smollm2_plain.generate(ids, 8))
    _, cache = smollm2.run_with_cache(ids)
    _, cache_p = smollm2_plain.run_with_cache(ids)
    names = list(cache_p.keys())
    assert list(cache.keys()) == names
    for name in names:
        a, b = cache[name], cache_p[name]
        scale = max(1.0, float(b[torch.isfinite(b)].abs().max()))  # (masked scores: -inf)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4 * scale, msg=name)
    pattern = "blocks.3.attn.hook_pattern"
    torch.testing.assert_close(cache[pattern], cache_p[pattern], rtol=0, atol=1e-5)


def test_smollm2_weight_views_dequantise(smollm2, smollm2_plain):
    for name in ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out", "W_E", "W_U"):
        assert torch.equal(getattr(smollm2, name), getattr(smollm2_plain, name)), name


def test_process_weights_dequantises_what_it_folds(smollm2_gguf_path, smollm2_plain):
    model = multihead.load(smollm2_gguf_path)
    reference = multihead.load(smollm2_gguf_path, quantized=False)
    with pytest.warns(UserWarning, match="RMSNorm"):
        model.process_weights_()
        reference.process_weights_()
    attn = model.layers[0].attn
    assert isinstance(attn.in_proj, torch.nn.Linear)  # folded: dequantised
    assert isinstance(attn.out_proj, QuantizedLinear)  # not written: still packed
    assert isinstance(model.tok, QuantizedEmbedding) and not model.config.tie_embeddings
    ids = model.to_tokens("Folding keeps the logits")
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids), rtol=0, atol=2e-3)


def test_packed_rows_refuses_unknown_form():
    with pytest.raises(ValueError, match="form must be one of"):
        PackedRows("int3", (2, 32), torch.zeros(2, 16, dtype=torch.uint8))


@pytest.mark.gpu
def test_smollm2_quantized_on_cuda(smollm2_gguf_path, smollm2_plain):
    model = multihead.load(smollm2_gguf_path, device="cuda")
    assert model.layers[0].attn.in_proj.packed.qs.device.type == "cuda"
    ids = model.to_tokens("The capital of France is").cpu()
    with torch.no_grad():
        logits = model(ids.cuda()).cpu()
        torch.testing.assert_close(logits, smollm2_plain(ids), rtol=0, atol=2e-3)
    assert torch.equal(model.generate(ids.cuda(), 6).cpu(), smollm2_plain.generate(ids, 6))


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_tiny_files_on_cuda_equal_the_dequantised_model(tmp_path, qtype):
    path = tmp_path / f"tiny-{qtype}.gguf"
    if qtype in WRITABLE:
        write_gguf(path, "llama", qtype)
    else:
        write_raw_gguf(path, Q[qtype])
    plain = multihead.load(path, quantized=False)  # CPU, float32
    packed = multihead.load(path, device="cuda")
    attn = packed.layers[1].attn
    assert isinstance(attn.in_proj, QuantizedLinear)
    assert attn.in_proj.weight.device.type == "cuda"
    torch.testing.assert_close(attn.in_proj.weight.cpu(), plain.layers[1].attn.in_proj.weight)
    ids = torch.tensor([[5, 17, 2, 40, 11, 63, 7], [1, 2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        expected = plain(ids)
        atol = 1e-4 * float(expected.abs().max())  # cuBLAS sums in another order (TF32 off)
        torch.testing.assert_close(packed(ids.cuda()).cpu(), expected, rtol=1e-3, atol=atol)
        torch.testing.assert_close(
            packed(ids[:, :1].cuda()).cpu(), plain(ids[:, :1]), rtol=1e-3, atol=atol
        )


_RSS_CHILD = r"""
import json, resource, sys
import torch, multihead
from multihead.models import gguf  # noqa: F401  (imports before the baseline)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
before = rss()
model = multihead.load(sys.argv[1], quantized=sys.argv[2] == "1")
with torch.no_grad():
    model(torch.tensor([[1, 2, 3]]))
# VmHWM: this process image's peak (ru_maxrss keeps the forking parent's across exec)
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
print(json.dumps(dict(growth=peak - before)))
"""


def test_smollm2_packed_load_peak_memory(smollm2_gguf_path):
    """Peak RSS growth of a packed load (and one forward) at most 0.4x the dequantised one's,
    each in a fresh process; the file is mapped a tensor at a time."""
    import json
    import subprocess
    import sys

    growth = {}
    for quantized in ("1", "0"):
        done = subprocess.run(
            [sys.executable, "-c", _RSS_CHILD, str(smollm2_gguf_path), quantized],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        growth[quantized] = json.loads(done.stdout.strip().splitlines()[-1])["growth"]
    assert growth["1"] <= 0.4 * growth["0"], growth


@pytest.mark.parametrize("rows", [1, 12])  # the kernel's path and the dequantise + GEMM one
def test_input_gradient_through_packed_matrix(rows):
    g = torch.Generator().manual_seed(3)
    N, K = 24, 64
    qs = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    scale, zero = torch.rand(N, K // 32, generator=g), torch.randn(N, K // 32, generator=g)
    layer = QuantizedLinear(PackedRows("int4", (N, K), qs, scale, zero))
    x = torch.randn(rows, K, dtype=torch.float64, generator=g).float().requires_grad_()
    layer(x).pow(2).sum().backward()
    x64 = x.detach().double().requires_grad_()
    (x64 @ layer.weight.double().t()).pow(2).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)


def test_packed_ops_pass_opcheck():
    """The custom operators torch.compile sees: real and fake kernels agree (shapes, dtypes),
    schema and dispatch as torch.library.opcheck checks them."""
    g = torch.Generator().manual_seed(0)
    N, K = 24, 64
    qs = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    q8 = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    scale = torch.rand(N, K // 32, generator=g).half()
    x = torch.randn(3, K, generator=g)
    index = torch.tensor([3, 0, 3])
    for args in (
        (x, qs, scale, None, "int4"),
        (x, qs, scale, scale, "int4"),
        (x, q8, scale, None, "int8"),
    ):
        torch.library.opcheck(kernels.packed_mm, args)
    for x_pair in (x[:1], x):  # one row: one kernel call; three: the two products
        torch.library.opcheck(
            kernels.packed_mm_pair, (x_pair, qs, scale, scale, qs[:5], scale[:5], None, "int4")
        )
        torch.library.opcheck(
            kernels.packed_mm_pair, (x_pair, q8, scale, None, q8[3:], scale[3:], None, "int8")
        )
    torch.library.opcheck(kernels.packed_take, (qs, scale, None, index, "int4", K))
    torch.library.opcheck(kernels.packed_take, (q8, scale, None, index, "int8", K))


@pytest.mark.parametrize("qtype", ["Q4_0"])  # (the int8 operator: opcheck above)
def test_packed_model_compiles_fullgraph(tmp_path, qtype):
    """torch.compile(fullgraph=True) takes a packed model (the products are operators, not
    ctypes calls) and gives the eager logits; generate(compile=True) the eager tokens."""
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf(path, "llama", qtype)
    model = multihead.load(path)
    assert isinstance(model.tok, QuantizedEmbedding)
    ids = torch.tensor([[5, 17, 2, 40, 11, 63, 7]])
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(ids[:, :1]), model(ids[:, :1]), rtol=1e-5, atol=1e-5)
        tokens = model.generate(ids, 4, compile={"backend": "aot_eager"})
    assert torch.equal(tokens, model.generate(ids, 4))


def test_packed_model_is_frozen_and_records_no_graph(smollm2, smollm2_plain):
    """A packed model's parameters (norms, biases: what is not packed) do not require grad, so
    run_with_cache without no_grad records no autograd graph (on an 8B-shaped file that graph
    raised the peak from 6.4 to 8.9 GiB); gradients with respect to activations still flow."""
    assert not any(p.requires_grad for p in smollm2.parameters())
    assert all(p.requires_grad for p in smollm2_plain.parameters())  # 0.3's model: as loaded
    ids = smollm2.to_tokens("The cat sat on the mat")
    logits, cache = smollm2.run_with_cache(ids)
    assert not logits.requires_grad and not cache["blocks.0.hook_resid_post"].requires_grad
    x = smollm2.tok(ids).detach().requires_grad_(True)
    smollm2.layers[0].ffn.down(smollm2.layers[0].ffn.up(x)).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("form", ["int4", "int8"])
def test_gate_and_up_in_one_call_equal_two_calls(form):
    """SwiGLU's packed gate and up are read with one kernel call at one row of activations
    (linear_pair): the values equal the two separate products bit for bit, with or without a
    module hook (a hook makes the block call the two modules), and against float64."""
    g = torch.Generator().manual_seed(5)
    K = 96

    def packed(N: int, K: int) -> PackedRows:
        scale = torch.rand(N, K // 32, generator=g).half()
        if form == "int8":
            q8 = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
            return PackedRows("int8", (N, K), q8, scale)
        qs = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
        return PackedRows("int4", (N, K), qs, scale, torch.randn(N, K // 32, generator=g).half())

    x = torch.randn(1, 1, K, generator=g)
    first, second = QuantizedLinear(packed(43, K)), QuantizedLinear(packed(37, K))  # 4 n + 3, + 1
    a, b = multihead.modules.quantized.linear_pair(first, second, x)
    assert torch.equal(a, first(x)) and torch.equal(b, second(x))
    assert a.shape == (1, 1, 43) and b.shape == (1, 1, 37)
    mlp = multihead.modules.feedforward.SwiGLU(K, 64)
    mlp.gate, mlp.up = QuantizedLinear(packed(64, K)), QuantizedLinear(packed(64, K))
    mlp.down = QuantizedLinear(packed(K, 64))
    fused = mlp(x)
    seen = []
    handle = mlp.up.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        hooked = mlp(x)
    finally:
        handle.remove()
    assert len(seen) == 1 and torch.equal(fused, hooked)
    w = {n: getattr(mlp, n).weight.double() for n in ("gate", "up", "down")}
    x64 = x.double()
    expected = (torch.nn.functional.silu(x64 @ w["gate"].t()) * (x64 @ w["up"].t())) @ w["down"].t()
    atol = 1e-6 * float(expected.abs().max())  # float32 sums
    torch.testing.assert_close(fused.double(), expected, rtol=1e-4, atol=atol)
