"""MultiHeadAttention's plain path (`_plain_forward`: the common call in the fewest Python
steps) against the general path of `forward` and the fp64 textbook reference: the same answer
for every call it takes, and it takes exactly the calls with nothing to decide."""

import pytest
import torch

from helpers_spies import count_calls
from multihead import MultiHeadAttention
from multihead.functional import masks
from multihead.hook_points import HookSession
from multihead.modules.cache import KVCache

from reference import reference_attention

B, T, C, H = 2, 9, 24, 6


def _plain_calls(monkeypatch) -> dict[str, int]:
    return count_calls(monkeypatch, MultiHeadAttention, {"_plain_forward": "plain"})


def _textbook(m: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The module's math written out in fp64: packed projection, attention, output projection."""
    Hkv, D = m.num_kv_heads, m.head_dim
    qkv = torch.nn.functional.linear(x, m.in_proj.weight, m.in_proj.bias)
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = (t.unflatten(-1, (-1, D)).transpose(1, 2) for t in (q, k, v))
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    out, _ = reference_attention(q, k, v, mask=mask)
    return m.out_proj(out.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("kv_heads", [6, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_plain_call_matches_the_reference_and_takes_the_plain_path(monkeypatch, kv_heads, causal):
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, num_kv_heads=kv_heads, causal=causal).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    calls = _plain_calls(monkeypatch)
    out = m(x)
    assert calls["plain"] == 1
    mask = masks.causal(T, T) if causal else None
    torch.testing.assert_close(out, _textbook(m, x, mask))
    # the general path (a key mask of all True keeps no key out) gives the same answer
    general = m(x, key_mask=torch.ones(B, T, dtype=torch.bool))
    assert calls["plain"] == 1
    torch.testing.assert_close(out, general)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_decoding_on_the_plain_path_equals_the_reference(monkeypatch, static, window, padded):
    """Decode steps with a KVCache (static or growing, with a window, holding padding from the
    prefill) run the plain path and equal full attention under the equivalent dense mask."""
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, num_kv_heads=2, causal=True).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    key_mask = torch.ones(B, T, dtype=torch.bool)
    if padded:
        key_mask[1, :2] = False  # the second row's first two tokens are padding
    cache = KVCache(B, 2, 4, max_length=T if static else None, window=window, dtype=torch.float64)
    calls = _plain_calls(monkeypatch)
    outs = [m(x[:, :4], cache=cache, key_mask=key_mask[:, :4] if padded else None)]
    for t in range(4, T):
        outs.append(m(x[:, t : t + 1], cache=cache))
    assert calls["plain"] == (T - 4) + (0 if padded else 1)
    allowed = masks.causal(T, T)
    if window is not None:
        allowed = allowed & masks.sliding_window(T, T, window)
    allowed = allowed & key_mask[:, None, None, :]
    expected = _textbook(m, x, allowed)
    got = torch.cat(outs, dim=1)
    # rows that see no key at all (a padded first token) are zero attention: output bias
    torch.testing.assert_close(got, expected)


def test_calls_with_something_to_decide_take_the_general_path(monkeypatch):
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H)
    x = torch.randn(B, T, C)
    calls = _plain_calls(monkeypatch)
    m(x, mask=torch.ones(T, T, dtype=torch.bool))
    m(x, window=3)
    m(x, return_weights=True)
    m(x[0])  # unbatched
    m(x, x.clone())  # cross-attention inputs
    with HookSession(None).active():  # an open session covering every attention module
        m(x)
    assert calls["plain"] == 0
    m(x)
    assert calls["plain"] == 1


def test_plain_path_refuses_a_mismatched_input_by_name():
    m = MultiHeadAttention(C, H)
    with pytest.raises((TypeError, ValueError), match="query"):
        m(torch.randn(B, T, C, dtype=torch.float64))
    with pytest.raises(ValueError, match="query"):
        m(torch.randn(B, T, C + 1))


class _DoubledLinear(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def _double_by_hook(layer):
    return layer.register_forward_hook(lambda mod, args, out: out * 2)


def _double_on_the_instance(layer):
    # as accelerate's hooks do: a forward set on the module instance
    plain_forward = layer.forward
    layer.forward = lambda x: plain_forward(x) * 2


def _double_by_subclass(layer):
    layer.__class__ = _DoubledLinear


def _double_by_pre_hook(layer):
    return layer.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))


@pytest.mark.parametrize(
    "override", [_double_by_hook, _double_on_the_instance, _double_by_subclass, _double_by_pre_hook]
)
@pytest.mark.parametrize("layer_name", ["in_proj", "out_proj"])
def test_the_projections_own_overrides_are_honoured(override, layer_name):
    """The plain path skips Module.__call__ on its projections only where that adds nothing:
    a hook, a pre-hook, a subclass's forward or a forward set on the instance doubles the
    layer here, and the output must be the module's with that layer's weight (and bias)
    doubled. `_plain` (the test `linear` and the feed-forward's chunked path run) must
    refuse the same layers."""
    from multihead.modules.projections import _plain

    torch.manual_seed(0)
    m = MultiHeadAttention(C, H).double().eval()
    x = torch.randn(B, T, C, dtype=torch.float64)
    expected = MultiHeadAttention(C, H).double().eval()
    expected.load_state_dict(m.state_dict())
    layer, twin = getattr(m, layer_name), getattr(expected, layer_name)
    pre_hook = override is _double_by_pre_hook
    with torch.no_grad():
        twin.weight *= 2
        if not pre_hook:  # (doubling the input doubles x W^T, not the bias)
            twin.bias *= 2
    override(layer)
    assert not _plain(layer)
    torch.testing.assert_close(m(x), expected(x))


def test_global_module_hooks_reach_the_projections():
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    from multihead.modules.projections import _plain

    m = MultiHeadAttention(C, H).eval()
    seen: list[str] = []
    names = {id(layer): name for name, layer in m.named_modules()}
    for register in (register_module_forward_hook, register_module_forward_pre_hook):
        handle = register(lambda mod, *rest: seen.append(names.get(id(mod), "?")))
        try:
            assert not _plain(m.in_proj)
            m(torch.randn(B, T, C))
        finally:
            handle.remove()
        assert {"in_proj", "out_proj"} <= set(seen)
        seen.clear()
    assert _plain(m.in_proj)


@pytest.mark.parametrize("static", [False, True])
def test_reordered_cache_decodes_the_rows_it_kept(static):
    """`KVCache.reorder` (beam search) keeps rows in the order given; a static cache, whose
    keys and values share one buffer, re-views both halves: the next decode step equals the
    fp64 reference over the kept rows' tokens."""
    torch.manual_seed(0)
    m = MultiHeadAttention(C, H, num_kv_heads=2, causal=True).double()
    x = torch.randn(3, T, C, dtype=torch.float64)
    cache = KVCache(3, 2, 4, max_length=T if static else None, dtype=torch.float64)
    m(x[:, : T - 1], cache=cache)
    rows = torch.tensor([2, 0])
    cache.reorder(rows)
    kept = x[rows]
    got = m(kept[:, T - 1 :], cache=cache)
    expected = _textbook(m, kept, masks.causal(T, T))[:, T - 1 :]
    torch.testing.assert_close(got, expected)
