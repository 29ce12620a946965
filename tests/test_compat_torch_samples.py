"""The drop-ins against torch on torch's own test samples, as the torch wheel ships them.

- `op_db`'s `nn.functional.scaled_dot_product_attention` OpInfo: every sample input (it defines no
  error inputs), each dtype it lists for CPU, outputs and input gradients, dropout included
  (same seed, same draws);
- `module_db`'s `nn.MultiheadAttention` ModuleInfo: every module input (it defines no error
  inputs), in training with gradients of inputs and parameters, and in eval under no_grad (where
  torch runs its fused kernel), against torch's module holding the same weights.

The samples come from `torch.testing._internal`, which is torch's test infrastructure and may
change between releases; the tests pin no sample count.
"""

import pytest
import torch
from torch import nn

from multihead.compat import MultiheadAttention
from multihead.functional import scaled_dot_product_attention

common_methods_invocations = pytest.importorskip(
    "torch.testing._internal.common_methods_invocations"
)
common_modules = pytest.importorskip("torch.testing._internal.common_modules")

SDPA_INFO = next(
    op
    for op in common_methods_invocations.op_db
    if op.name == "nn.functional.scaled_dot_product_attention"
)
MHA_INFO = next(m for m in common_modules.module_db if m.module_cls is nn.MultiheadAttention)
TOLERANCE = {
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.float32: dict(atol=1e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def test_the_infos_define_no_error_inputs():
    """Documented so that a torch release that adds error inputs makes this file grow."""
    assert SDPA_INFO.error_inputs_func is None
    assert MHA_INFO.module_error_inputs_func is None


def _run(fn, sample, seed):
    torch.manual_seed(seed)
    return fn(sample.input, *sample.args, **sample.kwargs)


@pytest.mark.parametrize("dtype", sorted(SDPA_INFO.supported_dtypes("cpu"), key=str), ids=str)
def test_sdpa_opinfo_samples(dtype):
    grads = dtype == torch.float64
    samples = list(SDPA_INFO.sample_inputs("cpu", dtype, requires_grad=grads))
    assert samples
    for i, sample in enumerate(samples):
        theirs = _run(torch.nn.functional.scaled_dot_product_attention, sample, seed=i)
        ours = _run(scaled_dot_product_attention, sample, seed=i)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, sample
        torch.testing.assert_close(ours, theirs, **TOLERANCE[dtype], msg=f"sample {i}: {sample}")
        if grads:
            inputs = [t for t in (sample.input, *sample.args) if isinstance(t, torch.Tensor)]
            up = torch.randn_like(theirs)
            expected = torch.autograd.grad(theirs, inputs, up)
            got = torch.autograd.grad(ours, inputs, up)
            for a, b in zip(got, expected, strict=True):
                torch.testing.assert_close(a, b, **TOLERANCE[dtype])


def _modules(module_input, dtype):
    ctor = module_input.constructor_input
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(*ctor.args, **ctor.kwargs, dtype=dtype)
    ours = MultiheadAttention(*ctor.args, **ctor.kwargs, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _detached(forward_input, requires_grad):
    args = [
        a.detach().clone().requires_grad_(requires_grad) if isinstance(a, torch.Tensor) else a
        for a in forward_input.args
    ]
    return args, dict(forward_input.kwargs)


def _outputs(result):
    return [t for t in result if t is not None]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_mha_moduleinfo_inputs(dtype, training):
    inputs = MHA_INFO.module_inputs_func(
        MHA_INFO, device="cpu", dtype=dtype, requires_grad=training, training=training
    )
    assert inputs
    for module_input in inputs:
        ref, ours = _modules(module_input, dtype)
        ref.train(training), ours.train(training)
        args_r, kwargs = _detached(module_input.forward_input, training)
        args_o, _ = _detached(module_input.forward_input, training)
        with torch.enable_grad() if training else torch.no_grad():
            expected, got = _outputs(ref(*args_r, **kwargs)), _outputs(ours(*args_o, **kwargs))
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(
                a,
                b,
                **TOLERANCE[dtype],
                msg=str(module_input.constructor_input.kwargs),
            )
        if not training:
            continue
        ups = [torch.randn_like(t) for t in expected]
        torch.autograd.backward(expected, ups)
        torch.autograd.backward(got, ups)
        for a, b in zip(args_o, args_r, strict=True):
            torch.testing.assert_close(a.grad, b.grad, **TOLERANCE[dtype])
        for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, **TOLERANCE[dtype], msg=name)


def test_mha_moduleinfo_reference_fn_accepts_the_drop_in():
    """torch's own reference (the same module run batched) agrees with the drop-in unbatched."""
    for module_input in MHA_INFO.module_inputs_func(
        MHA_INFO, device="cpu", dtype=torch.float64, requires_grad=False, training=False
    ):
        _, ours = _modules(module_input, torch.float64)
        ours.eval()
        args, kwargs = _detached(module_input.forward_input, False)
        expected = module_input.reference_fn(ours, *args, **kwargs)
        got = ours(*args, **kwargs)
        for a, b in zip(_outputs(got), _outputs(expected), strict=True):
            torch.testing.assert_close(a, b)
