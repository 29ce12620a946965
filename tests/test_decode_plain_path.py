"""The plain paths an eager decode step takes when nothing observes the model: RoPE rotated in
place on the fused projection (MultiHeadAttention), and TransformerBlock's short path. Each
gives the general path's values bit for bit (the general path is what runs under hooks), the
fp64 textbook attention's within fp32 tolerance, and the same gradients."""

import math

import pytest
import torch

from multihead import CausalLM, LMConfig, MultiHeadAttention
from multihead.interpret import run_with_cache, run_with_hooks
from multihead.modules.cache import KVCache
from multihead.modules.norm import RMSNorm
from multihead.positional import RotaryEmbedding

from reference import reference_attention

B, H, HKV, D = 2, 6, 2, 8  # mutually distinct; grouped-query heads
C = H * D


def _rope_attention(rotary_dim=None, base=500.0) -> MultiHeadAttention:
    torch.manual_seed(0)
    rope = RotaryEmbedding(D, base=base, rotary_dim=rotary_dim)
    return MultiHeadAttention(C, H, num_kv_heads=HKV, causal=True, position=rope).eval()


def _general(m: MultiHeadAttention, x, **kwargs):
    """The general path on the same call: key=query is self-attention, but not the hot path."""
    return m(x, x, **kwargs)


def _reference(m: MultiHeadAttention, xs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """fp64: project, rotate by the rotate-half formula, textbook attention (causal over every
    token so far), merge, project out. xs (B, T, C); positions (B, T)."""
    w, wo = m.in_proj.weight.double(), m.out_proj.weight.double()
    b, bo = m.in_proj.bias.double(), m.out_proj.bias.double()
    qkv = (xs.double() @ w.T + b).view(B, -1, H + 2 * HKV, D).transpose(1, 2)
    q, k, v = qkv.split((H, HKV, HKV), dim=1)
    r = m.position.rotary_dim
    inv = 1.0 / (m.position.base ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    angles = positions.double()[..., None] * inv  # (B, T, r/2)
    cos = torch.cat([angles, angles], -1).cos()[:, None]
    sin = torch.cat([angles, angles], -1).sin()[:, None]

    def rot(t):
        a, rest = t[..., :r], t[..., r:]
        a1, a2 = a.chunk(2, -1)
        return torch.cat([a * cos + torch.cat([-a2, a1], -1) * sin, rest], -1)

    out, _ = reference_attention(rot(q), rot(k), v, causal=True)
    return out.transpose(1, 2).reshape(B, -1, C) @ wo.T + bo


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_rope_plain_path_is_the_general_path_bit_for_bit_and_the_reference(rotary_dim):
    m = _rope_attention(rotary_dim)
    torch.manual_seed(1)
    xs = torch.randn(B, 7, C)
    plain_cache = KVCache(B, HKV, D, max_length=9)
    general_cache = KVCache(B, HKV, D, max_length=9)
    outs = []
    with torch.no_grad():
        # a prefill of 4 tokens, then 3 decode steps; positions from the cache
        for chunk in (xs[:, :4], xs[:, 4:5], xs[:, 5:6], xs[:, 6:7]):
            got = m(chunk, cache=plain_cache)
            torch.testing.assert_close(got, _general(m, chunk, cache=general_cache), rtol=0, atol=0)
            outs.append(got)
    positions = torch.arange(7).expand(B, 7)
    expected = _reference(m, xs, positions).float()
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=1e-4, atol=1e-5)
    # the cache holds the rotated keys and the values, as the general path's
    torch.testing.assert_close(plain_cache._kv, general_cache._kv, rtol=0, atol=0)


def test_rope_plain_path_with_per_row_positions_and_no_cache():
    m = _rope_attention()
    torch.manual_seed(2)
    x = torch.randn(B, 5, C)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    with torch.no_grad():
        got = m(x, positions=positions)
        torch.testing.assert_close(got, _general(m, x, positions=positions), rtol=0, atol=0)
        # the keys of each row, rotated by its own positions (no cache: causal over the call)
        torch.testing.assert_close(got, _reference(m, x, positions).float(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        m(x, positions=positions - 3)
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\)"):
        m(x, positions=positions[:, :4])
    with pytest.raises(TypeError, match="integer tensor"):
        m(x, positions=positions.float())


def test_rope_plain_path_gradients_match_the_general_path():
    m = _rope_attention().train()
    torch.manual_seed(3)
    x = torch.randn(B, 5, C, requires_grad=True)
    g = torch.randn(B, 5, C)
    grads = []
    for run in (lambda: m(x), lambda: _general(m, x)):
        m.zero_grad()
        x.grad = None
        run().backward(g)
        grads.append((x.grad.clone(), m.in_proj.weight.grad.clone()))
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert grads[0][0].abs().sum() > 0


def _lm(**overrides) -> CausalLM:
    torch.manual_seed(4)
    cfg = dict(
        vocab_size=41,
        dim=24,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        position="rope",
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
        dropout=0.1,  # eval mode: the identity, so the plain path serves it
    )
    cfg.update(overrides)
    return CausalLM(LMConfig(**cfg)).eval()


@pytest.mark.parametrize(
    "overrides", [{}, {"parallel_residual": True}, {"attention_only": True}, {"dropout": 0.0}]
)
def test_block_plain_path_gives_the_hooked_values(overrides):
    """Decoding with no hooks (the plain paths) against the same decode under a read-only hook
    (the general paths): identical logits, and run_with_cache shows those values."""
    m = _lm(**overrides)
    ids = torch.randint(0, 41, (2, 6))

    def decode(run):
        caches = m.make_caches(2, max_length=8)
        first = run(ids[:, :5], caches=caches)
        return torch.cat([first, run(ids[:, 5:], caches=caches)], 1)

    def hooked(*args, **kwargs):
        seen = []
        out = run_with_hooks(
            m, *args, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, n: seen.append(n))],
            **kwargs,
        )  # fmt: skip
        assert seen  # the general path ran
        return out

    with torch.no_grad():
        plain = decode(m)
        torch.testing.assert_close(plain, decode(hooked), rtol=0, atol=0)
        logits, cache = run_with_cache(m, ids)
    torch.testing.assert_close(logits, m(ids), rtol=0, atol=0)
    torch.testing.assert_close(logits[:, -1], plain[:, -1], rtol=1e-5, atol=1e-5)
    assert "blocks.1.attn.hook_rot_k" in cache


def test_block_plain_path_fires_torch_hooks_and_keeps_training_dropout():
    m = _lm()
    calls = []
    handles = [
        m.layers[0].norm1.register_forward_hook(lambda mod, i, o: calls.append("norm1")),
        m.layers[0].attn.register_forward_hook(lambda mod, i, o: calls.append("attn")),
        m.layers[0].ffn.register_forward_hook(lambda mod, i, o: calls.append("ffn")),
        m.layers[0].norm2.register_forward_hook(lambda mod, i, o: calls.append("norm2")),
    ]
    ids = torch.randint(0, 41, (2, 6))
    with torch.no_grad():
        m(ids)
    assert calls == ["norm1", "attn", "norm2", "ffn"]
    for h in handles:
        h.remove()
    m.train()  # dropout 0.1 is live: two calls differ (the general path applies it)
    torch.manual_seed(5)
    a = m(ids)
    torch.manual_seed(6)
    assert not torch.equal(a, m(ids))


def test_block_plain_path_undoes_its_cache_append_when_the_mlp_fails():
    m = _lm()
    block = m.layers[0]
    cache = KVCache(2, 2, 4, max_length=8)

    class Failing(torch.nn.Module):
        def forward(self, x):
            raise ValueError("mlp failed")

    block.ffn = Failing()
    with torch.no_grad(), pytest.raises(ValueError, match="mlp failed"):
        block(torch.randn(2, 3, 24), cache=cache)
    assert cache.length == 0 and cache._stored == 0


def test_rmsnorm_is_f_rms_norm_bit_for_bit():
    torch.manual_seed(7)
    for shape in [(1, 1, 576), (3, 5, 48), (2, 9, 960)]:
        norm = RMSNorm(shape[-1], eps=1e-5)
        with torch.no_grad():
            norm.weight.normal_()
        x = torch.randn(shape) * 3
        expected = torch.nn.functional.rms_norm(x, (shape[-1],), norm.weight, 1e-5)
        torch.testing.assert_close(norm(x), expected, rtol=0, atol=0)
        bare = RMSNorm(shape[-1], eps=1e-5, elementwise_affine=False)
        torch.testing.assert_close(
            bare(x), torch.nn.functional.rms_norm(x, (shape[-1],), None, 1e-5), rtol=0, atol=0
        )
    assert math.isfinite(float(norm(torch.zeros(1, 960)).sum()))  # eps keeps zeros finite
    with pytest.raises(RuntimeError, match="960"):  # a width that is not the norm's: refused
        norm(torch.randn(2, 1))


def test_modules_called_as_their_forward_only_when_nothing_watches_the_call():
    """The plain paths call children's forward directly (module_call.bare); a global module
    hook, or a hook on one block, sees every call it would see through Module.__call__, and
    the logits stay the same."""
    from torch.nn.modules.module import register_module_forward_hook

    m = _lm()
    ids = torch.randint(0, 41, (2, 6))
    with torch.no_grad():
        plain = m(ids)
    seen: list[str] = []
    names = {id(mod): name for name, mod in m.named_modules()}
    handle = register_module_forward_hook(lambda mod, i, o: seen.append(names.get(id(mod), "?")))
    try:
        with torch.no_grad():
            hooked = m(ids)
    finally:
        handle.remove()
    torch.testing.assert_close(hooked, plain, rtol=0, atol=0)
    for i in range(2):
        for part in ("", ".norm1", ".attn", ".attn.in_proj", ".attn.out_proj", ".norm2", ".ffn"):
            assert f"layers.{i}{part}" in seen, (i, part)
        assert f"layers.{i}.ffn.down" in seen
    block_calls = []
    h = m.layers[1].register_forward_hook(lambda mod, i, o: block_calls.append(o.shape))
    try:
        with torch.no_grad():
            torch.testing.assert_close(m(ids), plain, rtol=0, atol=0)
    finally:
        h.remove()
    assert block_calls == [torch.Size([2, 6, 24])]


def test_a_compiled_child_module_keeps_its_compiled_call():
    """`Module.compile()` puts the compiled call in `__call__`: such a child is not called as
    its bare forward (its compiled code runs, seen through a backend that counts calls)."""
    m = _lm()
    ids = torch.randint(0, 41, (2, 6))
    with torch.no_grad():
        plain = m(ids)
    runs: list[int] = []

    def counting(gm, example_inputs):
        def run(*args):
            runs.append(1)
            return gm(*args)

        return run

    m.layers[1].compile(backend=counting)
    with torch.no_grad():
        torch.testing.assert_close(m(ids), plain, rtol=1e-6, atol=1e-6)
    assert runs, "the compiled layer's code never ran"
