"""The backend registry, backend="auto" selection and explain()."""

import pytest
import torch

from multihead.functional import (
    attention,
    available_backends,
    explain,
    register_backend,
    unregister_backend,
)
from multihead.functional.backends import get_backend


def qkv():
    return torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)


def test_builtin_backends_in_priority_order():
    assert available_backends()[:4] == ["tiled", "flex", "sdpa", "eager"]


def test_auto_prefers_sdpa_and_weights_route_to_eager():
    q, k, v = qkv()
    assert explain(q, k, v).chosen == "sdpa"
    e = explain(q, k, v, return_weights=True)
    assert e.chosen == "eager"
    assert "weights" in " ".join(e.reasons["sdpa"])
    assert "sdpa" in str(e) and "weights" in str(e)


def test_explicit_backend_that_cannot_run_lists_reasons():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"backend 'sdpa' cannot run.*weights"):
        attention(q, k, v, return_weights=True, backend="sdpa")
    q0 = q[:, :, :0]
    with pytest.raises(ValueError, match=r"weights.*empty sequence"):
        attention(q0, k, v, return_weights=True, backend="sdpa")


def test_unknown_backend_names_the_known_ones():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"unknown backend 'flash9'.*auto, .*sdpa"):
        attention(q, k, v, backend="flash9")


def test_register_a_backend_in_one_call_and_auto_uses_it():
    calls = []

    def doubling(call):
        calls.append(call)
        out, _ = get_backend("eager").run(call)
        return out * 2, None

    def why_not(call):
        return ["only for causal calls"] if not call.causal else []

    register_backend("doubling", doubling, why_not=why_not, priority=100)
    try:
        q, k, v = qkv()
        ref = attention(q, k, v, causal=True, backend="eager")
        torch.testing.assert_close(attention(q, k, v, causal=True), ref * 2)
        assert explain(q, k, v).chosen == "sdpa"
        assert explain(q, k, v).reasons["doubling"] == ["only for causal calls"]
        assert calls[0].groups == 2 and calls[0].scale == pytest.approx(8**-0.5)
        with pytest.raises(ValueError, match=r"already registered"):
            register_backend("doubling", doubling)
    finally:
        unregister_backend("doubling")
    assert "doubling" not in available_backends()


def test_structure_only_backend_is_never_asked_about_plain_calls():
    asked = []

    def why_not(call):
        asked.append(call.structure is not None)
        return []

    def run(call):
        return attention(call.q, call.k, call.v, causal=call.causal, backend="eager"), None

    register_backend(
        "structured-spy", run, why_not=why_not, priority=100, structured=True, structure_only=True
    )
    try:
        q, k, v = qkv()
        assert explain(q, k, v, causal=True).chosen == "sdpa"
        attention(q, k, v, causal=True)  # a plain call: auto skips it without a question
        assert asked.count(False) == 1  # (explain() lists every backend's reasons)
        attention(q, k, v, causal=True, window=3)  # a structured call is offered to it
        assert asked[-1] is True
        assert explain(q, k, v, causal=True, window=3).chosen == "structured-spy"
    finally:
        unregister_backend("structured-spy")


def test_register_rejects_reserved_name():
    with pytest.raises(ValueError, match=r"auto"):
        register_backend("auto", lambda call: (call.q, None))


def test_explain_rejects_unknown_kwargs():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"maks"):
        explain(q, k, v, maks=None)
