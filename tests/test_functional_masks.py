"""Mask helpers: conventions, alignment and conversions."""

import sys

import pytest
import torch

from multihead.functional import attention, masks
from multihead.functional.call import make_call


def test_causal_alignments():
    br = masks.causal(2, 4)
    assert br.tolist() == [[True, True, True, False], [True, True, True, True]]
    tl = masks.causal(2, 4, align="top_left")
    assert tl.tolist() == [[True, False, False, False], [True, True, False, False]]
    assert torch.equal(masks.causal(3), torch.ones(3, 3, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match=r"align"):
        masks.causal(2, 2, align="middle")


def test_sliding_window():
    m = masks.sliding_window(4, 4, 2)
    assert m.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [False, True, True, False],
        [False, False, True, True],
    ]
    # Bottom-right: a single query at the end of 5 keys sees the last 2.
    assert masks.sliding_window(1, 5, 2).tolist() == [[False, False, False, True, True]]
    sym = masks.sliding_window(3, 3, 2, causal=False)
    assert sym.tolist() == [[True, True, False], [True, True, True], [False, True, True]]
    with pytest.raises(ValueError, match=r"window"):
        masks.sliding_window(3, 3, 0)


@pytest.mark.parametrize("window", [sys.maxsize, 10**30])
def test_a_sliding_window_wider_than_the_sequence_is_causal_or_full(window):
    assert torch.equal(masks.sliding_window(3, 5, window), masks.causal(3, 5))
    assert masks.sliding_window(3, 5, window, causal=False).all()


def test_padding():
    m = masks.padding([2, 0, 3])
    assert m.tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    assert masks.padding(torch.tensor([1]), max_len=3).tolist() == [[True, False, False]]
    with pytest.raises(ValueError, match=r"max_len"):
        masks.padding([4], max_len=2)
    with pytest.raises(ValueError, match=r"non-negative"):
        masks.padding([-1])


def test_combine():
    a = torch.tensor([[True, False], [True, True]])
    b = torch.tensor([True, False])
    assert masks.combine(a, None, b).tolist() == [[True, False], [True, False]]
    assert masks.combine(None, None) is None
    with pytest.raises(TypeError):
        masks.combine(a, torch.ones(2))


def test_conversions():
    blocked = torch.tensor([[False, True]])
    assert masks.from_torch_mha(blocked).tolist() == [[True, False]]
    with pytest.raises(TypeError, match=r"bias"):
        masks.from_torch_mha(torch.zeros(1, 2))
    hf = torch.tensor([[1, 1, 0]])
    assert masks.from_hf_padding(hf).tolist() == [[True, True, False]]
    with pytest.raises(ValueError, match=r"0 .*1"):
        masks.from_hf_padding(torch.tensor([[2, 1]]))
    bias = masks.to_bias(torch.tensor([True, False]))
    assert bias[0] == 0 and bias[1] == torch.finfo(torch.float32).min


def test_bias_from_mask_equals_mask():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    torch.testing.assert_close(
        attention(q, k, v, mask=mask), attention(q, k, v, bias=masks.to_bias(mask))
    )


def test_sliding_window_mask_through_attention_matches_explicit_causal():
    q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    big_window = masks.sliding_window(6, 6, 6)
    torch.testing.assert_close(attention(q, k, v, mask=big_window), attention(q, k, v, causal=True))
    call = make_call(q, k, v, mask=big_window)
    # Every backend sees a 4-D mask: a view of the caller's (T, T) one, not a copy.
    assert call.mask.shape == (1, 1, 6, 6) and call.mask.data_ptr() == big_window.data_ptr()
