"""Hooks, caches, capture and head gates are scoped to the thread (context) and the model that
opened them, and leaving a `with` block restores everything in any order, after exceptions too.

Overlap is forced, not hoped for: a hook in one thread blocks that thread inside its forward
pass (session open, half the layers run) until the other thread has finished its own forward.
Every wait has a timeout, so a failure cannot hang the suite."""

import threading
from contextlib import ExitStack

import pytest
import torch

from helpers_bert import save_bert
from multihead import CausalLM, LMConfig
from multihead.hook_points import hooks_for
from multihead.hooked.hooks import BY_NAME_ONLY
from multihead.interpret import (
    act_name,
    capture,
    head_gates,
    hook_names,
    hooks,
    run_with_cache,
    run_with_hooks,
)

WAIT = 20.0  # seconds; generous for a loaded CI machine, bounded
B, T, V = 2, 6, 43


def lm(seed):
    torch.manual_seed(seed)
    cfg = LMConfig(vocab_size=V, dim=24, num_layers=2, num_heads=4, ffn_dim=36)
    return CausalLM(cfg).eval()


def in_thread(target):
    """Start `target` in a thread; the returned join() re-raises what it raised."""
    errors = []

    def run():
        try:
            target()
        except BaseException as e:  # re-raised by join()
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join():
        thread.join(WAIT)
        assert not thread.is_alive(), "thread did not finish in time"
        if errors:
            raise errors[0]

    return join


def pause_until(event):
    """A read-only hook that blocks this thread's forward until `event` is set."""

    def fn(activation, name):
        assert event.wait(WAIT), "the other thread never finished"

    return fn


def test_two_threads_two_models_capture_separately():
    a, b = lm(0), lm(1)
    ids = torch.randint(0, V, (B, T))
    a_inside, b_done = threading.Event(), threading.Event()
    got = {}

    def thread_a():
        with (
            capture(a) as records,
            hooks(a, [(act_name("z", 0), lambda z, n: a_inside.set())]),
            hooks(a, [(act_name("z", 1), pause_until(b_done))]),
        ):
            got["a"] = a(ids)
        got["a_records"] = records

    join = in_thread(thread_a)
    assert a_inside.wait(WAIT)  # thread A is inside a's forward, its capture open
    with capture(b) as b_records, capture() as any_records:
        got["b"] = b(ids)
    b_done.set()
    join()
    a_records = got["a_records"]
    assert a_records.names() == ["layers.0.attn", "layers.1.attn"]
    assert b_records.names() == ["layers.0.attn", "layers.1.attn"]
    assert any_records.names() == ["attention", "attention"]  # this thread's calls only
    with torch.no_grad():
        _, cache_a = run_with_cache(a, ids, names=lambda n: n.endswith("pattern"))
        _, cache_b = run_with_cache(b, ids, names=lambda n: n.endswith("pattern"))
    for i in range(2):
        torch.testing.assert_close(a_records[i].weights, cache_a["pattern", i])
        torch.testing.assert_close(b_records[i].weights, cache_b["pattern", i])
        torch.testing.assert_close(any_records[i].weights, cache_b["pattern", i])
    assert not torch.allclose(cache_a["pattern", 0], cache_b["pattern", 0])


def test_a_gated_thread_and_an_ungated_thread_on_one_model():
    model = lm(0)
    ids = torch.randint(0, V, (B, T))
    gates = torch.ones(2, 4)
    gates[0] = 0  # every head of layer 0 off: a large change
    with torch.no_grad():
        plain = model(ids)
        with head_gates(model, gates):
            gated_alone = model(ids)
    assert not torch.allclose(plain, gated_alone, atol=1e-2)
    gated_inside, plain_done = threading.Event(), threading.Event()
    got = {}

    def gated_thread():
        with (
            torch.no_grad(),
            head_gates(model, gates),
            hooks(model, [(act_name("z", 0), lambda z, n: gated_inside.set())]),
            hooks(model, [(act_name("resid_mid", 1), pause_until(plain_done))]),
        ):
            got["gated"] = model(ids)

    join = in_thread(gated_thread)
    assert gated_inside.wait(WAIT)  # the gates are open in the other thread, mid-forward
    assert hooks_for(model.layers[0].attn) is None  # ... and invisible here
    with torch.no_grad():
        got["plain"] = model(ids)
    plain_done.set()
    join()
    assert torch.equal(got["plain"], plain)  # the ungated thread saw exactly the plain model
    assert torch.equal(got["gated"], gated_alone)


def test_observed_encode_runs_each_text_in_the_calling_thread(tmp_path):
    """Under hooks (head_gates, hooks(), capture), encode runs each text alone, in order, in the
    calling thread (no packed worker batches: observers see one text's (1, T) activations in
    input order), with the same gated result whatever the thread settings."""
    from multihead.pretrained import load_encoder

    save_bert(tmp_path, hidden_size=30, num_attention_heads=5, num_hidden_layers=2)
    enc = load_encoder(tmp_path)
    words = ["the cat sat on the mat", "dog run fast", "a b c d e f g h i j k l m", "cat !"]
    texts = [" ".join(words[i % 4] for _ in range(1 + i % 5)) for i in range(24)]
    gates = torch.ones(2, 5)
    gates[0, 1] = gates[1, 3] = 0
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with head_gates(enc, gates):
            single = enc.encode(texts, batch_size=1)
        torch.set_num_threads(2)  # unobserved, two single-threaded workers would share batches
        seen: list[tuple[int, int]] = []

        def note(z, name):
            seen.append((threading.get_ident(), z.shape[1]))

        with head_gates(enc, gates), hooks(enc, [(act_name("z", 0), note)]):
            multi = enc.encode(texts, batch_size=1)
        ungated = enc.encode(texts, batch_size=1)
    finally:
        torch.set_num_threads(threads)
    assert {t for t, _ in seen} == {threading.get_ident()}
    assert [n for _, n in seen] == [len(ids) for ids in enc.tokenize(texts)]
    torch.testing.assert_close(multi, single, atol=1e-6, rtol=1e-5)
    assert abs(multi - ungated).max() > 1e-3


def test_sessions_close_in_any_order():
    model = lm(0)
    ids = torch.randint(0, V, (B, T))
    seen = []

    def mark(tag):
        return lambda z, name: seen.append(tag)

    z0 = act_name("z", 0)
    stack_a, stack_b = ExitStack(), ExitStack()
    stack_a.enter_context(hooks(model, [(z0, mark("a"))]))
    stack_b.enter_context(hooks(model, [(z0, mark("b"))]))
    model(ids)
    assert seen == ["a", "b"]  # outer session first
    stack_a.close()  # the outer one leaves first
    model(ids)
    assert seen == ["a", "b", "b"]
    stack_b.close()
    model(ids)
    assert seen == ["a", "b", "b"]
    assert hooks_for(model.layers[0].attn) is None


def test_exceptions_leave_nothing_behind():
    model = lm(0)
    ids = torch.randint(0, V, (B, T))
    with torch.no_grad():
        plain = model(ids)
    gates = torch.zeros(2, 4)
    with pytest.raises(RuntimeError, match="inside the block"), head_gates(model, gates):
        raise RuntimeError("inside the block")

    def failing(z, name):
        raise RuntimeError("inside a hook")

    with pytest.raises(RuntimeError, match="inside a hook"):
        run_with_hooks(model, ids, fwd_hooks=[(act_name("z", 1), failing)])
    with pytest.raises(RuntimeError, match="inside a hook"), capture(model):
        run_with_hooks(model, ids, fwd_hooks=[(act_name("pattern", 0), failing)])
    with torch.no_grad():
        assert torch.equal(model(ids), plain)
    for module in model.modules():
        assert hooks_for(module) is None


def test_a_session_on_one_model_leaves_another_alone():
    a, b = lm(0), lm(1)
    ids = torch.randint(0, V, (B, T))
    with torch.no_grad():
        plain_b = b(ids)
    seen = []
    with torch.no_grad(), hooks(a, [(lambda n: True, lambda x, n: seen.append(n))]):
        with head_gates(a, torch.zeros(2, 4)):
            assert torch.equal(b(ids), plain_b)
        assert seen == []
        a(ids)
    # a's own forward, once, every point a predicate selects (per-head inputs: by name only)
    assert seen == [n for n in hook_names(a) if not n.endswith(BY_NAME_ONLY)]
