"""A decoding step's packed products (one row of activations): `PackedRows.one_row`, the C
kernel with its per-call work cut to the call, its plan kept on the module while the buffers
stay where they are. References: the general path's kernel call (`kernels.run_kernel` with the
matrix's `kernel_args`, bit for bit) and F.linear on the float64 textbook dequantisation."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from multihead.modules.quantized import PackedRows, QuantizedLinear, kernels
from multihead.modules.quantized.linear import linear_pair
from test_quantized_prefill import CASES, packed_matrix, textbook

needs_kernel = pytest.mark.skipif(
    not kernels.kernels_available(), reason="no C compiler: one_row declines (tested below)"
)


def general(p: PackedRows, x: torch.Tensor) -> torch.Tensor:
    """The general path's kernel call for one row, (1, K) -> (1, N)."""
    args = kernels.kernel_args(p.form, p.qs, p.scale, p.zero)
    assert args is not None
    return kernels.run_kernel(x.reshape(1, -1).contiguous(), args)


@pytest.fixture
def one_row_calls(monkeypatch):
    """The products `one_row` answered (not None): the path is taken, not assumed."""
    answered: list[tuple[int, ...]] = []
    real = PackedRows.one_row

    def spy(self, x):
        y = real(self, x)
        if y is not None:
            answered.append(tuple(y.shape))
        return y

    monkeypatch.setattr(PackedRows, "one_row", spy)
    return answered


@needs_kernel
@pytest.mark.parametrize(("form", "stored"), CASES)
@pytest.mark.parametrize("shape", [(1, 1), (1,), ()])  # x (1, 1, K), (1, K), (K,)
def test_one_row_equals_the_kernel_call_and_the_textbook(form, stored, shape, one_row_calls):
    N, K = 300, 608  # (a tail of rows past the kernel's blocks; 19 groups)
    layer = QuantizedLinear(packed_matrix(form, N, K, stored))
    x = torch.randn(*shape, K, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = layer(x)
    assert one_row_calls == [(*shape, N)]
    assert y.shape == (*shape, N)
    assert torch.equal(y.reshape(1, N), general(layer.packed, x))
    ref = F.linear(x.double(), textbook(layer.packed)).float()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize(("form", "stored"), [CASES[0], CASES[2], CASES[3]])  # zero: kept, none
def test_the_kept_plan_follows_new_buffers_moved_storage_and_copies(form, stored, one_row_calls):
    N, K = 64, 96
    layer = QuantizedLinear(packed_matrix(form, N, K, stored, seed=0))
    x = torch.randn(1, K)
    with torch.no_grad():
        before = layer(x)
        # load_state_dict(assign=True): new tensors with other values
        other = packed_matrix(form, N, K, stored, seed=5)
        layer.packed.load_state_dict(other.state_dict(), assign=True)
        after = layer(x)
        assert torch.equal(after, general(other, x))
        assert not torch.equal(after, before)
        # share_memory_: the same tensors, their storage moved (new addresses)
        address = layer.packed.qs.data_ptr()
        layer.share_memory()
        assert layer.packed.qs.data_ptr() != address
        assert torch.equal(layer(x), after)
        # in-place values (load_state_dict without assign copies into the same storage)
        layer.packed.load_state_dict(packed_matrix(form, N, K, stored, seed=7).state_dict())
        assert torch.equal(layer(x), general(layer.packed, x))
        # a deep copy and a pickle carry no plan (addresses, a C function), and still compute
        twin = copy.deepcopy(layer)
        assert "_row_plan" not in twin.packed.__dict__
        assert torch.equal(twin(x), layer(x))
        thawed = pickle.loads(pickle.dumps(layer))
        assert torch.equal(thawed(x), layer(x))
    assert len(one_row_calls) == 8


@needs_kernel
def test_one_row_declines_where_another_path_must_run(one_row_calls):
    N, K = 40, 64
    layer = QuantizedLinear(packed_matrix("int4", N, K, "float16"))
    ref = F.linear(torch.ones(1, K, dtype=torch.float64), textbook(layer.packed)).float()
    # a gradient: the autograd function runs (the input's gradient is g @ W)
    x = torch.ones(1, K, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, textbook(layer.packed).sum(0, keepdim=True).float())
    torch.testing.assert_close(y.detach(), ref, rtol=1e-5, atol=1e-4)
    # more than one row, another dtype
    with torch.no_grad():
        layer(torch.ones(2, K))
        layer.packed.one_row(torch.ones(1, K, dtype=torch.float64))
    assert one_row_calls == []
    assert layer.packed.one_row(torch.ones(1, K, dtype=torch.float64)) is None
    assert layer.packed.one_row(torch.ones(2, K)) is None


@needs_kernel
def test_a_bias_is_added_on_the_one_row_path(one_row_calls):
    N, K = 40, 64
    bias = torch.randn(N)
    layer = QuantizedLinear(packed_matrix("int8", N, K, "float16"), bias=bias)
    x = torch.randn(1, 1, K)
    with torch.no_grad():
        y = layer(x)
    assert one_row_calls == [(1, 1, N)]
    assert torch.equal(y, (general(layer.packed, x) + bias).view(1, 1, N))


@needs_kernel
def test_the_pair_reads_the_kept_plans(one_row_calls):
    K = 96
    gate = QuantizedLinear(packed_matrix("int4", 48, K, "float16", seed=1))
    up = QuantizedLinear(packed_matrix("int4", 40, K, "float16", seed=2))
    x = torch.randn(1, 1, K)
    with torch.no_grad():
        a, b = linear_pair(gate, up, x)
        first = general(gate.packed, x)
        new = packed_matrix("int4", 48, K, "float16", seed=3)
        gate.packed.load_state_dict(new.state_dict(), assign=True)
        c, _ = linear_pair(gate, up, x)
    assert torch.equal(a.view(1, -1), first)
    assert torch.equal(c.view(1, -1), general(new, x))
    assert torch.equal(b.view(1, -1), general(up.packed, x))
    assert not torch.equal(a, c)


@needs_kernel
def test_the_default_dtype_does_not_change_the_products():
    # the C code writes float32: its outputs and buffers are float32 whatever
    # torch.set_default_dtype says (float64 there once gave a dtype error on the prefill
    # path and a float64 buffer holding float32 bits on the one-row path)
    layer = QuantizedLinear(packed_matrix("int4", 64, 96, "float16"))
    pair = QuantizedLinear(packed_matrix("int4", 40, 96, "float16", seed=3))
    one, many = torch.randn(1, 1, 96), torch.randn(20, 96)
    with torch.no_grad():
        want = (layer(one), layer(many), layer.weight, linear_pair(layer, pair, one))
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            got = (layer(one), layer(many), layer.weight, linear_pair(layer, pair, one))
        finally:
            torch.set_default_dtype(before)
    for a, b in zip(want[:3], got[:3], strict=True):
        assert b.dtype == torch.float32 and torch.equal(a, b)
    for a, b in zip(want[3], got[3], strict=True):
        assert b.dtype == torch.float32 and torch.equal(a, b)
