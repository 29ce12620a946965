"""Packed variable-length attention against the fp64 textbook reference, one sequence at a time,
and against the padded + masked path of the same modules."""

import numpy as np
import pytest
import torch

from multihead import MultiHeadAttention
from multihead.functional import VarLen, varlen_attention
from multihead.modules import TransformerBlock
from multihead.positional import ALiBi, RotaryEmbedding

from reference import reference_attention

LENGTHS = [5, 5, 5, 3, 7, 1, 3, 3, 2]  # unsorted, with runs of equal lengths and a length 1


def per_sequence_reference(q, k, v, lengths, causal=False):
    """Each sequence alone through the textbook reference: (N, H, D) -> (N, H, Dv)."""
    outs, start = [], 0
    for n in lengths:
        rows = slice(start, start + n)
        qs, ks, vs = (t[rows].transpose(0, 1)[None] for t in (q, k, v))  # (1, heads, n, D)
        out, _ = reference_attention(qs, ks, vs, causal=causal)
        outs.append(out[0].transpose(0, 1))
        start += n
    return torch.cat(outs)


def test_varlen_runs_positions_and_mean():
    packed = VarLen(LENGTHS)
    assert packed.total == sum(LENGTHS) and len(packed) == len(LENGTHS)
    assert packed.runs == ((0, 3, 5), (15, 1, 3), (18, 1, 7), (25, 1, 1), (26, 2, 3), (32, 1, 2))
    expected = torch.cat([torch.arange(n) for n in LENGTHS])
    assert torch.equal(packed.positions(), expected)
    x = torch.randn(packed.total, 4, dtype=torch.float64)
    means = torch.stack([chunk.mean(0) for chunk in x.split(LENGTHS)])
    torch.testing.assert_close(packed.mean(x), means)
    assert VarLen.of(packed) is packed
    assert VarLen(torch.tensor([2, 3])).lengths == (2, 3)
    assert VarLen(np.array([2, 3])).lengths == (2, 3)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_each_sequence_alone(heads, kv_heads, causal):
    torch.manual_seed(0)
    N = sum(LENGTHS)
    q = torch.randn(N, heads, 8, dtype=torch.float64)
    k = torch.randn(N, kv_heads, 8, dtype=torch.float64)
    v = torch.randn(N, kv_heads, 6, dtype=torch.float64)  # Dv != D
    out = varlen_attention(q, k, v, LENGTHS, causal=causal)
    assert out.shape == (N, heads, 6)
    torch.testing.assert_close(out, per_sequence_reference(q, k, v, LENGTHS, causal))


def test_gradients_match_each_sequence_alone():
    torch.manual_seed(1)
    N = sum(LENGTHS)
    inputs = [torch.randn(N, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    grads = torch.autograd.grad(varlen_attention(*inputs, LENGTHS).square().sum(), inputs)
    ref_grads = torch.autograd.grad(per_sequence_reference(*inputs, LENGTHS).square().sum(), inputs)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


def test_empty_and_single_run():
    q = torch.randn(0, 2, 4)
    assert varlen_attention(q, q, q, []).shape == (0, 2, 4)
    x = torch.randn(12, 2, 4, dtype=torch.float64)
    torch.testing.assert_close(
        varlen_attention(x, x, x, [4, 4, 4]), per_sequence_reference(x, x, x, [4, 4, 4])
    )


def test_bad_input_names_the_argument():
    x = torch.randn(10, 2, 4)
    with pytest.raises(ValueError, match=r"lengths\[1\] must be a positive int, got 0"):
        varlen_attention(x, x, x, [10, 0])
    with pytest.raises(ValueError, match=r"lengths\[0\] must be a positive int, got 2.5"):
        VarLen([2.5])
    with pytest.raises(TypeError, match="lengths must be a sequence of ints"):
        VarLen(7)
    with pytest.raises(ValueError, match=r"q has shape \(10, 2, 4\), but the lengths sum to 9"):
        varlen_attention(x, x, x, [4, 5])
    # The rest is the one validation every attention call gets (make_call), on the (1, heads,
    # N, head_dim) views of the packed tensors.
    with pytest.raises(
        ValueError, match=r"k must be a \(N, heads, head_dim\) tensor, got \(10, 4\)"
    ):
        varlen_attention(x, x[:, 0], x, [10])
    with pytest.raises(ValueError, match=r"key/value heads \(2, .*\) must divide query heads \(3"):
        varlen_attention(torch.randn(10, 3, 4), x, x, [10])
    with pytest.raises(ValueError, match=r"head_dim of q .* differ \(5 != 4\)"):
        varlen_attention(torch.randn(10, 2, 5), x, x, [10])
    with pytest.raises(TypeError, match="q, k, v must share one dtype"):
        varlen_attention(x.double(), x, x, [10])
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        varlen_attention(x.long(), x, x, [10])
    with pytest.raises(ValueError, match=r"dropout_p must be a float in \[0, 1\)"):
        varlen_attention(x, x, x, [10], dropout_p=1.0)
    for scale in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"scale must be finite and positive"):
            varlen_attention(x, x, x, [10], scale=scale)
    with pytest.raises(TypeError, match=r"causal must be a bool, got str 'no'"):
        varlen_attention(x, x, x, [10], causal="no")


def pad(x, lengths):
    """Packed (N, C) -> padded (B, T, C) and key_mask (B, T)."""
    T = max(lengths)
    out = x.new_zeros(len(lengths), T, x.shape[-1])
    key_mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    for i, chunk in enumerate(x.split(lengths)):
        out[i, : len(chunk)] = chunk
        key_mask[i, : len(chunk)] = True
    return out, key_mask


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_module_packed_equals_padded_with_key_mask(kv_heads):
    torch.manual_seed(2)
    mha = MultiHeadAttention(16, 4, num_kv_heads=kv_heads, dtype=torch.float64)
    x = torch.randn(sum(LENGTHS), 16, dtype=torch.float64)
    padded, key_mask = pad(x, LENGTHS)
    ref = mha(padded, key_mask=key_mask)[key_mask]
    torch.testing.assert_close(mha(x, lengths=LENGTHS), ref)
    causal = mha(padded, key_mask=key_mask, causal=True)[key_mask]
    torch.testing.assert_close(mha(x, lengths=VarLen(LENGTHS), causal=True), causal)


@pytest.mark.parametrize("position", ["rope", "alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_positions_restart_in_each_packed_sequence(position, causal):
    torch.manual_seed(4)
    module = RotaryEmbedding(4) if position == "rope" else ALiBi(4)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, position=module, dtype=torch.float64)
    x = torch.randn(sum(LENGTHS), 16, dtype=torch.float64)
    padded, key_mask = pad(x, LENGTHS)  # right padding: each row starts at position 0 too
    ref = mha(padded, key_mask=key_mask, causal=causal)[key_mask]
    torch.testing.assert_close(mha(x, lengths=LENGTHS, causal=causal), ref)
    # and each sequence alone, unbatched
    alone = torch.cat([mha(chunk, causal=causal) for chunk in x.split(LENGTHS)])
    torch.testing.assert_close(mha(x, lengths=LENGTHS, causal=causal), alone)


@pytest.mark.parametrize("norm_first", [False, True])
def test_block_packed_equals_padded(norm_first):
    torch.manual_seed(3)
    block = TransformerBlock(16, 4, 32, norm_first=norm_first, dtype=torch.float64).eval()
    x = torch.randn(sum(LENGTHS), 16, dtype=torch.float64)
    padded, key_mask = pad(x, LENGTHS)
    torch.testing.assert_close(
        block(x, lengths=LENGTHS), block(padded, key_mask=key_mask)[key_mask]
    )


def test_module_packed_bad_input():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(6, 16)
    with pytest.raises(ValueError, match="key_mask cannot be combined with lengths"):
        mha(x, key_mask=torch.ones(6, dtype=torch.bool), lengths=[6])
    with pytest.raises(ValueError, match="key, return_weights cannot be combined with lengths"):
        mha(x, x, return_weights=True, lengths=[6])
    with pytest.raises(
        ValueError, match=r"query must be packed tokens \(N, 16\), got \(1, 6, 16\)"
    ):
        mha(x[None], lengths=[6])
    with pytest.raises(ValueError, match=r"query has shape \(6, 16\), but the lengths sum to 5"):
        mha(x, lengths=[2, 3])
    cross = TransformerBlock(16, 4, 32, cross_attention=True)
    with pytest.raises(ValueError, match="do not support cross-attention"):
        cross(x, lengths=[6])
