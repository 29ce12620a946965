"""When torch.nn.MultiheadAttention uses `attn_mask` and when it trusts the `is_causal` hint.

torch's fused fast path (eval, no grad, batch-first self-attention, even heads, ...) applies the
mask and ignores the hint; its standard path ignores the mask and runs a top-left causal mask when
there is no key padding mask and no weights are asked for. The drop-in must match torch's output in
every combination. The mask given with the hint here is deliberately *not* causal (it blocks key
0 for every query but the first), so using the mask and using the hint give different outputs.
"""

import itertools

import pytest
import torch
from torch import nn

from multihead.compat import MultiheadAttention
from multihead.compat.mask_rules import torch_fast_path

E, H, L, B = 8, 2, 5, 3


def pair(**cfg):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, cfg.pop("heads", H), dropout=0.0, **cfg)
    ours = MultiheadAttention.from_torch(ref)
    return ref, ours


def not_causal_mask(dtype=torch.bool):
    blocked = torch.zeros(L, L, dtype=torch.bool)
    blocked[1:, 0] = True  # True = blocked in torch's convention
    if dtype == torch.bool:
        return blocked
    return torch.zeros(L, L).masked_fill(blocked, float("-inf"))


CASES = list(
    itertools.product(
        [True, False],  # batch_first
        [True, False],  # training
        [True, False],  # no_grad
        [True, False],  # need_weights
        [True, False],  # key padding mask
        [True, False],  # self-attention (query is key is value)
    )
)


@pytest.mark.parametrize("batch_first,training,no_grad,need_weights,kpm,self_attn", CASES)
def test_mask_or_hint_as_torch(batch_first, training, no_grad, need_weights, kpm, self_attn):
    ref, ours = pair(batch_first=batch_first)
    ref.train(training), ours.train(training)
    x = torch.randn(B, L, E) if batch_first else torch.randn(L, B, E)
    kv = x if self_attn else x.clone()
    pad = torch.zeros(B, L, dtype=torch.bool) if kpm else None
    kwargs = dict(
        attn_mask=not_causal_mask(),
        key_padding_mask=pad,
        need_weights=need_weights,
        is_causal=True,
    )
    with torch.no_grad() if no_grad else torch.enable_grad():
        expected = ref(x, kv, kv, **kwargs)[0]
        got = ours(x, kv, kv, **kwargs)[0]
        plain = ref(x, kv, kv, **{**kwargs, "is_causal": False})[0]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    # The case really distinguishes the two readings: the hint and the mask differ here.
    uses_mask = torch.allclose(expected, plain, atol=1e-6)
    hint = (
        not kpm
        and not need_weights
        and not (batch_first and not training and no_grad and self_attn)
    )
    assert uses_mask != hint


@pytest.mark.parametrize("no_grad", [True, False])
def test_is_causal_without_a_mask(no_grad):
    """torch's fast path ignores the hint, mask or not; its standard path requires the mask."""
    ref, ours = pair(batch_first=True)
    ref.eval(), ours.eval()
    x = torch.randn(B, L, E)
    with torch.no_grad() if no_grad else torch.enable_grad():
        if no_grad:  # fast path: runs unmasked, as torch does
            torch.testing.assert_close(
                ours(x, x, x, is_causal=True)[0], ref(x, x, x, is_causal=True)[0]
            )
        else:
            with pytest.raises(RuntimeError):
                ref(x, x, x, is_causal=True)
            with pytest.raises(ValueError, match="attn_mask is required"):
                ours(x, x, x, is_causal=True)


@pytest.mark.parametrize(
    "cfg,why",
    [
        (dict(heads=1), "odd heads"),
        (dict(bias=False), "no input bias"),
        (dict(add_bias_kv=True), "bias_k"),
        (dict(add_zero_attn=True), "zero attention"),
        (dict(kdim=6, vdim=6), "separate projections"),
    ],
)
def test_conditions_that_block_torchs_fast_path_restore_the_hint(cfg, why):
    ref, ours = pair(batch_first=True, **cfg)
    ref.eval(), ours.eval()
    x = torch.randn(B, L, E)
    kv = x if "kdim" not in cfg else torch.randn(B, L, 6)
    with torch.no_grad():
        assert not torch_fast_path(ref, x, kv, kv, None, None), why
        kwargs = dict(attn_mask=not_causal_mask(), need_weights=False, is_causal=True)
        torch.testing.assert_close(ours(x, kv, kv, **kwargs)[0], ref(x, kv, kv, **kwargs)[0])


def test_float_masks_block_the_fast_path():
    ref, ours = pair(batch_first=True)
    ref.eval(), ours.eval()
    x = torch.randn(B, L, E)
    kwargs = dict(attn_mask=not_causal_mask(torch.float32), need_weights=False, is_causal=True)
    with torch.no_grad():
        assert not torch_fast_path(ours, x, x, x, None, kwargs["attn_mask"])
        torch.testing.assert_close(ours(x, x, x, **kwargs)[0], ref(x, x, x, **kwargs)[0])


def test_fast_path_decision_matches_torchs_own():
    """`torch_fast_path` against torch's: its fused op is called exactly when we say so."""
    from unittest import mock

    x = torch.randn(B, L, E)
    for batch_first, training, no_grad in itertools.product([True, False], repeat=3):
        ref, _ = pair(batch_first=batch_first)
        ref.train(training)
        with torch.no_grad() if no_grad else torch.enable_grad():
            predicted = torch_fast_path(ref, x, x, x, None, None)
            with mock.patch("torch._native_multi_head_attention", return_value=(x, None)) as native:
                ref(x, x, x)
        assert native.called == predicted


@pytest.mark.parametrize("training,no_grad", [(False, True), (False, False), (True, False)])
@pytest.mark.parametrize("kpm", [False, True])
def test_encoder_layer_with_is_causal_matches_torch(training, no_grad, kpm):
    """torch's fused layer (eval, no grad) applies src_mask; its standard path gives the hint to
    the attention. The converted layer must do what torch's does in each case."""
    from copy import deepcopy

    from multihead.compat import replace_attention

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True).train(training)
    converted = replace_attention(deepcopy(layer))
    x = torch.randn(B, L, E)
    pad = torch.zeros(B, L, dtype=torch.bool) if kpm else None
    with torch.no_grad() if no_grad else torch.enable_grad():
        for mask in (not_causal_mask(), nn.Transformer.generate_square_subsequent_mask(L)):
            kwargs = dict(src_mask=mask, src_key_padding_mask=pad, is_causal=True)
            torch.testing.assert_close(
                converted(x, **kwargs), layer(x, **kwargs), atol=1e-5, rtol=1e-4
            )
