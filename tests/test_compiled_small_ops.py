"""The compiled decode step's one-query attention over a StaticKVCache as an operator
(`multihead::attend_prefix`): the C call over the cache's first `index` keys where its key mask
marks exactly those, else SDPA under the mask; its fake kernel's shapes (torch.library.opcheck);
values against the float64 textbook; a compiled model (fullgraph, no recompiles per step) whose
graph calls it, with logits equal to eager decoding's within float32 rounding."""

import pytest
import torch

import multihead.modules.attention as attention_module
from multihead.modules.quantized import kernels, kernels_available
from multihead.modules.static_cache import StaticKVCache
from test_decode_small_ops import _model

from reference import reference_attention


def _inputs(H=6, Hkv=2, D=16, R=24, n=9, padded=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, 1, D, generator=g)
    k, v = torch.randn(1, Hkv, R, D, generator=g), torch.randn(1, Hkv, R, D, generator=g)
    key_mask = torch.zeros(1, R, dtype=torch.bool)
    key_mask[:, :n] = True
    for s in padded:
        key_mask[:, s] = False
    return q, k, v, key_mask, torch.tensor(n)


def _textbook(q, k, v, key_mask):
    return reference_attention(q, k, v, mask=key_mask[:, None, None, :])[0].float()


CASES = [  # (H, Hkv, D, R, n, padded slots)
    (6, 2, 16, 24, 9, ()),  # the C call
    (4, 4, 8, 5, 5, ()),  # every slot written
    (9, 3, 64, 192, 160, ()),  # SmolLM2's heads
    (6, 2, 16, 24, 9, (0, 3)),  # left padding: SDPA under the mask
    (2, 1, 8, 10, 1, ()),  # one key
]


@pytest.mark.parametrize("case", CASES)
def test_attend_prefix_is_the_masked_textbook_attention(case):
    H, Hkv, D, R, n, padded = case
    q, k, v, key_mask, count = _inputs(H, Hkv, D, R, n, padded, seed=R + n)
    got = kernels.attend_prefix(q, k, v, key_mask, count)
    assert got.shape == (1, H, 1, D) and got.dtype == torch.float32
    torch.testing.assert_close(got, _textbook(q, k, v, key_mask), rtol=1e-5, atol=1e-6)


def test_attend_prefix_takes_the_c_call_only_for_a_prefix_mask(monkeypatch):
    if not kernels_available():
        pytest.skip("no C compiler here")
    lib = kernels._library()
    calls = []

    class Spy:  # the library, counting its one-query attention calls
        def __getattr__(self, name):
            if name == "mh_attend_one":
                return lambda *a: calls.append(1) or lib.mh_attend_one(*a)
            return getattr(lib, name)

    monkeypatch.setattr(kernels, "_library", lambda: Spy())
    kernels.attend_prefix(*_inputs())
    assert calls == [1]
    q, k, v, key_mask, count = _inputs(padded=(2,))
    kernels.attend_prefix(q, k, v, key_mask, count)  # a padded slot: SDPA
    key_mask[:, 12] = True  # a key past the count: SDPA
    kernels.attend_prefix(q, k, v, key_mask, count)
    assert calls == [1]


def test_attend_prefix_of_no_key_is_zeros():
    q, k, v, key_mask, count = _inputs(n=3, padded=(0, 1, 2))
    assert torch.equal(kernels.attend_prefix(q, k, v, key_mask, count), torch.zeros(1, 6, 1, 16))


@pytest.mark.parametrize("padded", [(), (1,)])
def test_attend_prefix_opcheck(padded):
    """Schema, fake kernel (shapes, dtype), autograd registration, AOT dispatch."""
    torch.library.opcheck(kernels.attend_prefix, _inputs(padded=padded))
    fake = kernels._attend_prefix_fake(*_inputs(H=9, Hkv=3, D=64, R=64, n=7))
    assert fake.shape == (1, 9, 1, 64)


def test_compiled_static_cache_step_calls_the_operator_and_matches_eager():
    """The compiled step (fullgraph) holds the operator, once per layer, and compiles once for
    every decode step; its logits equal eager decoding's over a KVCache within rounding."""
    model, ids = _model(), torch.randint(0, 61, (1, 5))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    step = torch.compile(lambda x, caches: model(x, caches=caches), fullgraph=True, backend=backend)
    with torch.no_grad():
        caches = model.make_caches(1, max_length=12)
        statics = [StaticKVCache(1, 2, 16, 12) for _ in range(2)]
        expected = model(ids, caches=caches)[:, -1]
        got = step(ids, statics)[:, -1]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        for _ in range(5):
            token = expected.argmax(-1)[:, None]
            expected = model(token, caches=caches)[:, -1]
            got = step(token, statics)[:, -1]
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert len(graphs) == 2  # the prefill and one step for every later token
    ops = [n.target for n in graphs[1].graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.multihead.attend_prefix.default) == 2  # one per layer


def test_generate_compiled_tokens_equal_eager_and_hooked_static_steps_keep_sdpa(monkeypatch):
    model, ids = _model(), torch.randint(0, 61, (1, 5))
    eager = model.generate(ids, 6)
    assert torch.equal(model.generate(ids, 6, compile={"backend": "eager"}), eager)
    # the general path (the operator declined) gives the eager static cache the same logits
    with torch.no_grad():
        statics = [StaticKVCache(1, 2, 16, 8) for _ in range(2)]
        plain = [StaticKVCache(1, 2, 16, 8) for _ in range(2)]
        model(ids, caches=statics)
        model(ids, caches=plain)
        token = ids[:, :1]
        got = model(token, caches=statics)
        monkeypatch.setattr(attention_module, "static_row_attention", lambda *a: None)
        torch.testing.assert_close(got, model(token, caches=plain), rtol=1e-5, atol=1e-5)


def _export_step(model, ids, token):
    class Step(torch.nn.Module):
        def __init__(self, model, caches):
            super().__init__()
            self.model, self.caches = model, caches

        def forward(self, x):
            return self.model(x, caches=self.caches)

    statics = [StaticKVCache(1, 2, 16, 12) for _ in range(2)]
    with torch.no_grad():
        model(ids, caches=statics)
        for c in statics:
            c._owner = None  # (export traces a copy of the model's modules)
        exported = torch.export.export(Step(model, statics), (token,))
        return exported, exported.module()(token)


def test_exported_static_cache_step_holds_the_operator(monkeypatch):
    """torch.export of a decode step over static caches: the operator stays one node per
    layer, and the exported step's logits are those of the step exported without it (the
    general path's masked SDPA) within float32 rounding."""
    model, ids = _model(), torch.randint(0, 61, (1, 5))
    token = ids[:, -1:]
    exported, got = _export_step(model, ids, token)
    ops = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.multihead.attend_prefix.default) == 2
    monkeypatch.setattr(attention_module, "static_row_attention", lambda *a: None)
    exported, expected = _export_step(model, ids, token)
    ops = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert torch.ops.multihead.attend_prefix.default not in ops
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
