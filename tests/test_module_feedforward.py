"""FeedForward: its inference fast paths (in-place activation, row chunks) equal the plain path."""

import pytest
import torch

from multihead.modules.feedforward import ACTIVATIONS, CHUNK_ROWS, FeedForward, activation


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("rows", [7, CHUNK_ROWS + 37])
def test_inference_paths_equal_autograd_path(name, rows):
    ffn = FeedForward(12, 20, activation_name=name)
    x = torch.randn(rows, 12)
    with torch.enable_grad():
        expected = ffn(x)  # parameters require grad: the plain, out-of-place path
    manual = ffn.fc2(activation(name)(ffn.fc1(x)))
    torch.testing.assert_close(expected, manual)
    with torch.no_grad():
        fast = ffn(x.view(1, rows, 12))
    assert fast.shape == (1, rows, 12)
    torch.testing.assert_close(fast[0], expected, atol=1e-6, rtol=1e-5)


def test_no_bias_chunked():
    ffn = FeedForward(8, 16, bias=False)
    x = torch.randn(2, CHUNK_ROWS, 8)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), ffn.fc2(torch.nn.functional.gelu(ffn.fc1(x))))


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation 'gelu2'"):
        FeedForward(8, 16, activation_name="gelu2")


def test_the_chunked_path_honours_a_forward_set_on_a_layer():
    """A forward set on the fc1 instance (as accelerate's hooks do) must run on the long
    no-grad input too, where the chunked path would otherwise read the weights directly."""
    torch.manual_seed(0)
    ffn = FeedForward(8, 16)
    x = torch.randn(1, CHUNK_ROWS + 5, 8)
    plain_fc1 = ffn.fc1.forward
    ffn.fc1.forward = lambda t: plain_fc1(t) * 2
    with torch.no_grad():
        expected = ffn.fc2(torch.nn.functional.gelu(plain_fc1(x) * 2))
        torch.testing.assert_close(ffn(x), expected)
