"""The dequantisers under torch.compile(fullgraph=True): a CUDA model's compiled prefill traces
them (its rows are dequantised tile by tile), so they must not reach the host kernel's build and
load (found on an H100: `generate(compile=True)` on a packed CUDA model failed inside dynamo)."""

import pytest
import torch

from multihead.modules.quantized.kernels import dequantize_int4, dequantize_int8


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("implicit_zero", [False, True])
def test_int4_dequantiser_traces_and_equals_eager(scale_dtype, implicit_zero):
    qs = torch.randint(0, 256, (12, 48), dtype=torch.uint8)  # 12 rows x 96 weights
    scale = torch.rand(12, 3).to(scale_dtype)
    zero = None if implicit_zero else torch.randn(12, 3).to(scale_dtype)
    traced = torch.compile(dequantize_int4, fullgraph=True)(qs, scale, zero)
    torch.testing.assert_close(traced, dequantize_int4(qs, scale, zero), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_int8_dequantiser_traces_and_equals_eager(scale_dtype):
    qs = torch.randint(-128, 128, (12, 96), dtype=torch.int8)
    scale = torch.rand(12, 3).to(scale_dtype)
    traced = torch.compile(dequantize_int8, fullgraph=True)(qs, scale)
    torch.testing.assert_close(traced, dequantize_int8(qs, scale), rtol=1e-6, atol=1e-6)
