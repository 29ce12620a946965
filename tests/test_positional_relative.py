"""Bucketed relative position bias (T5, MPNet) as a PositionScheme: buckets against transformers'
own functions and hand-computed values, MultiHeadAttention with it against the fp64 reference,
packed sequences against each sequence alone, and a table shared by views."""

import copy

import pytest
import torch
from torch import nn

from multihead import MultiHeadAttention
from multihead.positional import RelativePositionBias, SharedPosition, relative_position_bucket

from reference import reference_attention

B, H, T, C = 2, 3, 7, 24  # D = 8


def test_buckets_hand_computed():
    # 32 buckets, bidirectional: 16 per side, distances 0..7 exact, 8..127 log-spaced, then 15
    relative = torch.tensor([0, -1, 1, -7, 7, -8, 8, -127, -128, -5000, 5000])
    assert relative_position_bucket(relative).tolist() == [
        0,  # the query itself
        1,  # the key one slot before the query
        17,  # one slot after: the upper half
        7,
        23,
        8,  # 8 + log(8/8) / log(128/8) * 8 = 8
        24,
        15,  # 8 + floor(log(127/8) / log(16) * 8) = 8 + 7
        15,  # clamped to the last bucket
        15,
        31,
    ]
    # causal (bidirectional=False): keys after the query share bucket 0; all 32 buckets look
    # back, distances 0..15 exact; 127: 16 + floor(log(127/16) / log(8) * 16) = 31
    causal = relative_position_bucket(relative, bidirectional=False)
    assert causal.tolist() == [0, 1, 0, 7, 0, 8, 0, 31, 31, 31, 0]


@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "bidirectional"),
    [(32, 128, True), (32, 128, False), (16, 40, True), (64, 256, True), (10, 20, False)],
)
def test_buckets_match_transformers_t5(num_buckets, max_distance, bidirectional):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-600, 601)[None, :] - torch.arange(3)[:, None]  # (3, 1201)
    expected = t5.T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    got = relative_position_bucket(
        relative, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional
    )
    assert torch.equal(got, expected)


def test_buckets_match_transformers_mpnet():
    mpnet = pytest.importorskip("transformers.models.mpnet.modeling_mpnet")
    relative = torch.arange(-700, 701)
    expected = mpnet.MPNetEncoder.relative_position_bucket(relative)
    assert torch.equal(relative_position_bucket(relative), expected)


def _scheme(seed=0, **kwargs):
    scheme = RelativePositionBias(H, **kwargs)
    with torch.no_grad():
        scheme.weight.copy_(
            torch.randn(scheme.weight.shape, generator=torch.Generator().manual_seed(seed))
        )
    return scheme


def test_bias_is_the_table_at_each_pairs_bucket():
    scheme = _scheme(num_buckets=16, max_distance=20)
    q_index, k_index = torch.arange(5) + 4, torch.arange(9)  # queries at slots 4..8
    bias = scheme.bias(q_index, k_index)
    assert bias.shape == (1, H, 5, 9)
    for i in range(5):
        for j in range(9):
            bucket = relative_position_bucket(
                torch.tensor(j - (i + 4)), num_buckets=16, max_distance=20
            )
            torch.testing.assert_close(bias[0, :, i, j], scheme.weight[bucket], rtol=0, atol=0)


def test_attention_with_relative_bias_matches_the_reference():
    torch.manual_seed(0)
    scheme = _scheme()
    attn = MultiHeadAttention(C, H, position=scheme).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[1, :2] = False  # left padding in row 1
    out, weights = attn(x, key_mask=key_mask, return_weights=True)

    W, b = attn.in_proj.weight, attn.in_proj.bias
    qkv = x @ W.T + b  # (B, T, 3C)
    q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, -1))
    rel = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # key slot - query slot
    bias = torch.stack(
        [scheme.weight[relative_position_bucket(rel)][..., h] for h in range(H)]
    )  # (H, T, T), built here by indexing, not by the module
    ref_out, ref_weights = reference_attention(
        q, k, v, mask=key_mask[:, None, None, :], bias=bias[None]
    )
    ref = ref_out.transpose(1, 2).reshape(B, T, C) @ attn.out_proj.weight.T + attn.out_proj.bias
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(weights, ref_weights, atol=1e-10, rtol=1e-10)
    # the bias matters: the same attention without it differs
    plain = MultiHeadAttention(C, H).double()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if "position" not in k})
    assert (plain(x, key_mask=key_mask) - out).abs().max() > 1e-2


def test_packed_sequences_restart_at_slot_zero():
    torch.manual_seed(1)
    attn = MultiHeadAttention(C, H, position=_scheme()).eval()
    lengths = [5, 1, 9, 3]
    x = torch.randn(sum(lengths), C)
    packed = attn(x, lengths=lengths)  # (N, C)
    alone = torch.cat([attn(part[None])[0] for part in x.split(lengths)])
    torch.testing.assert_close(packed, alone, atol=1e-6, rtol=1e-5)


def test_a_shared_table_is_one_parameter_registered_once():
    table = _scheme()

    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                MultiHeadAttention(C, H, position=table.shared()) for _ in range(2)
            )
            self.table = table

    model = TwoLayers()
    table_keys = [k for k in model.state_dict() if "weight" in k and "proj" not in k]
    assert table_keys == ["table.weight"]
    assert sum(p is table.weight for p in model.parameters()) == 1
    views = [layer.position for layer in model.layers]
    assert all(isinstance(v, SharedPosition) and v.scheme is table for v in views)
    assert views[0] is not views[1]
    # one table: changing it changes every layer's bias
    idx = torch.arange(4)
    with torch.no_grad():
        table.weight.add_(1.0)
    for v in views:
        torch.testing.assert_close(v.bias(idx, idx), table.bias(idx, idx), rtol=0, atol=0)
    # conversions and copies keep the sharing
    model.double()
    assert model.layers[1].position.bias(idx, idx).dtype == torch.float64
    clone = copy.deepcopy(model)
    assert clone.layers[0].position.scheme is clone.table is clone.layers[1].position.scheme
    assert clone.table is not table


def test_checks_name_the_problem():
    with pytest.raises(ValueError, match=r"bias for 3 heads but the attention has 4 heads"):
        MultiHeadAttention(32, 4, position=RelativePositionBias(3))
    with pytest.raises(ValueError, match=r"bias for 3 heads but the attention has 4 heads"):
        MultiHeadAttention(32, 4, position=RelativePositionBias(3).shared())
    with pytest.raises(ValueError, match="num_buckets must be at least 4, got 2"):
        RelativePositionBias(3, num_buckets=2)
    with pytest.raises(ValueError, match="max_distance must exceed the 8 distances"):
        RelativePositionBias(3, num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="num_heads must be a positive int, got 0"):
        RelativePositionBias(0)
    with pytest.raises(TypeError, match="scheme must be a PositionScheme, got Linear"):
        SharedPosition(nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="RelativePositionBias, which does not use them"):
        MultiHeadAttention(C, H, position=_scheme())(
            torch.randn(1, 4, C), positions=torch.arange(4)
        )
