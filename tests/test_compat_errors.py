"""The drop-in raises on the inputs torch raises on, with ValueError/TypeError naming them."""

import pytest
import torch
from torch import nn

from multihead.compat import MultiheadAttention

E, H, L, S, B = 12, 3, 5, 7, 2


def modules(**cfg):
    ref = nn.MultiheadAttention(E, H, **cfg)
    ours = MultiheadAttention(E, H, **cfg)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


q, kv = torch.randn(L, B, E), torch.randn(S, B, E)
BAD_CALLS = [
    (
        "4-D query",
        (torch.randn(1, L, B, E), kv, kv),
        {},
        ValueError,
        r"query must be unbatched 2-D",
    ),
    ("2-D key with 3-D query", (q, kv[:, 0], kv), {}, ValueError, r"must all be 3-D"),
    ("wrong embed dim", (torch.randn(L, B, E + 1), kv, kv), {}, ValueError, r"embed_dim=12"),
    (
        "key/value lengths differ",
        (q, kv, kv[:-1]),
        {},
        ValueError,
        r"agree in batch and sequence length",
    ),
    (
        "batch differs",
        (q, torch.randn(S, B + 1, E), torch.randn(S, B + 1, E)),
        {},
        ValueError,
        r"batch sizes",
    ),
    (
        "2-D attn_mask of wrong size",
        (q, kv, kv),
        dict(attn_mask=torch.zeros(L, S + 1)),
        ValueError,
        r"attn_mask must have shape \(5, 7\) or \(6, 5, 7\)",
    ),
    (
        "3-D attn_mask of wrong size",
        (q, kv, kv),
        dict(attn_mask=torch.zeros(B, L, S)),
        ValueError,
        r"num_heads=3",
    ),
    (
        "4-D attn_mask",
        (q, kv, kv),
        dict(attn_mask=torch.zeros(1, B * H, L, S)),
        ValueError,
        r"attn_mask",
    ),
    (
        "int attn_mask",
        (q, kv, kv),
        dict(attn_mask=torch.zeros(L, S, dtype=torch.long)),
        TypeError,
        r"attn_mask must be bool",
    ),
    (
        "key_padding_mask of wrong shape",
        (q, kv, kv),
        dict(key_padding_mask=torch.zeros(B, S + 1, dtype=torch.bool)),
        ValueError,
        r"key_padding_mask must have shape \(2, 7\)",
    ),
    (
        "1-D key_padding_mask for batched",
        (q, kv, kv),
        dict(key_padding_mask=torch.zeros(S, dtype=torch.bool)),
        ValueError,
        r"key_padding_mask",
    ),
    (
        "int key_padding_mask",
        (q, kv, kv),
        dict(key_padding_mask=torch.zeros(B, S, dtype=torch.int32)),
        TypeError,
        r"key_padding_mask must be bool",
    ),
    (
        "is_causal without attn_mask",
        (q, kv, kv),
        dict(is_causal=True),
        ValueError,
        r"is_causal=True .* attn_mask is required",
    ),
]


@pytest.mark.parametrize("name,args,kwargs,exc,pattern", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_forward_inputs(name, args, kwargs, exc, pattern):
    ref, ours = modules()
    with pytest.raises(Exception):  # noqa: B017 - torch's own exception types vary
        ref(*args, **kwargs)
    with pytest.raises(exc, match=pattern):
        ours(*args, **kwargs)


def test_wrong_kdim_input():
    ref, ours = modules(kdim=6, vdim=6)
    with pytest.raises(AssertionError):  # torch's message is about weight shapes
        ref(q, kv, kv)
    with pytest.raises(ValueError, match=r"key \(7, 2, 12\) must have kdim=6"):
        ours(q, kv, kv)


@pytest.mark.parametrize(
    "args,kwargs,pattern",
    [
        ((12, 5), {}, r"embed_dim \(12\) must be divisible by num_heads \(5\)"),
        ((0, 3), {}, r"embed_dim must be a positive int"),
        ((12, 0), {}, r"num_heads must be a positive int"),
        ((12, -3), {}, r"num_heads"),
    ],
)
def test_bad_constructor(args, kwargs, pattern):
    with pytest.raises((ValueError, AssertionError)):
        nn.MultiheadAttention(*args, **kwargs)
    with pytest.raises(ValueError, match=pattern):
        MultiheadAttention(*args, **kwargs)


def test_dropout_out_of_range():
    with pytest.raises(ValueError, match=r"dropout must be a float in \[0, 1\), got 1.5"):
        MultiheadAttention(E, H, dropout=1.5)


def test_nested_tensor_inputs_are_refused_by_name():
    """torch takes NestedTensors on its fused path only; the drop-in refuses them clearly."""
    _, ours = modules(batch_first=True)
    nt = torch.nested.nested_tensor([torch.randn(4, E), torch.randn(6, E)], layout=torch.jagged)
    with pytest.raises(TypeError, match="query is a NestedTensor"):
        ours.eval()(nt, nt, nt)
