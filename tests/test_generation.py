"""Generation: compiled equals eager and compiles once, eos read in batches, inputs checked once
per call, and the model left exactly as it was."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from multihead import CausalLM, LMConfig
from multihead.modules.generation import head_copy_for

V = 61


def lm(position="learned", layers=2, tie=True, kv=None):
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=V,
        dim=24,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=kv,
        position=position,
        max_positions=96,
        tie_embeddings=tie,
    )
    m = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():  # spread the logits so greedy choices are not ties
            p.normal_(std=0.4)
    return m


def naive_greedy(model, ids, n):
    """Recompute the whole sequence at every step: the independent reference."""
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


def left_padded(prompts, pad_id=0):
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :], mask[i, P - len(p) :] = p, 1
    return ids, mask


# Dynamo's graphs run as captured ("eager" backend: what is tested is the capture), or through
# AOT autograd's functionalisation ("aot_eager": the in-place cache writes become graph
# mutations). Inductor's code generation runs in test_generation_inductor.py.
QUICK = {"backend": "eager"}
AOT = {"backend": "aot_eager"}


@pytest.mark.parametrize(
    "position,kv,options", [("learned", None, QUICK), ("rope", 2, AOT), ("alibi", 1, QUICK)]
)
def test_compiled_generation_equals_eager_and_compiles_once(position, kv, options):
    m = lm(position, layers=1, kv=kv)
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for P in (6, 9):  # another prompt length reuses both graphs
        ids = torch.randint(0, V, (3, P))
        expected = naive_greedy(m, ids, 12)
        assert torch.equal(m.generate(ids, 12), expected)
        assert torch.equal(m.generate(ids, 12, compile=options), expected)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [2, 2]  # the prefill and the decode step, compiled once each
    prompts = [torch.randint(0, V, (n,)) for n in (7, 2, 5)]
    ids, mask = left_padded(prompts)
    out = m.generate(ids, 10, attention_mask=mask, compile=options)
    for i, p in enumerate(prompts):
        assert torch.equal(out[i, ids.shape[1] :], naive_greedy(m, p[None], 10)[0, len(p) :])
    assert counters["stats"]["unique_graphs"] == 3  # + the padded prefill; the step is reused


def test_sampling_on_the_device_is_the_same_compiled():
    m = lm("rope", layers=1)
    ids = torch.randint(0, V, (2, 5))
    torch._dynamo.reset()
    kwargs = dict(temperature=0.9, top_k=20, top_p=0.9)
    a = m.generate(ids, 8, generator=torch.Generator().manual_seed(5), **kwargs)
    b = m.generate(ids, 8, generator=torch.Generator().manual_seed(5), compile=QUICK, **kwargs)
    assert torch.equal(a, b)


@pytest.mark.parametrize("every", [1, 3, 100])
def test_eos_read_in_batches_gives_the_same_tokens(every):
    m = lm()
    ids = torch.randint(0, V, (2, 5))
    free = m.generate(ids, 12)
    eos = int(free[0, 7])  # row 0's third new token
    out = m.generate(ids, 12, eos=eos, eos_check_every=every)
    first = [int((row[5:] == eos).nonzero()[0]) if (row[5:] == eos).any() else None for row in free]
    # rows agree with the free run up to their first eos, then hold eos
    for r, stop in enumerate(first):
        if stop is None:
            assert torch.equal(out[r, 5:], free[r, 5 : out.shape[1]])
        else:
            assert torch.equal(out[r, 5 : 5 + stop + 1], free[r, 5 : 5 + stop + 1])
            assert (out[r, 5 + stop :] == eos).all()
    # it stops at the step where every row has finished, whatever the read interval
    done = max(s for s in first) if None not in first else 11
    assert out.shape[1] == 5 + done + 1
    streamed = list(m.generate_stream(ids, 12, eos=eos, eos_check_every=every))
    assert torch.equal(torch.stack(streamed, 1), out[:, 5:])


@pytest.mark.parametrize("batch,new", [(1, 40), (3, 20), (1, 3)])
def test_generation_leaves_the_model_as_it_was_and_trainable(batch, new):
    """Batch 1 with many new tokens reads a re-laid-out copy of the head (checked below);
    nothing is written to the model: same parameters (objects, values, memory layout), still
    trainable."""
    assert (head_copy_for(lm(), batch, new) is not None) == (batch == 1 and new == 40)
    m = lm(tie=True)
    params = dict(m.named_parameters())
    before = {k: (v.detach().clone(), v.stride(), v.data_ptr()) for k, v in m.state_dict().items()}
    ids = torch.randint(0, V, (batch, 6))
    m.generate(ids, new)
    if batch == 1 and new == 40:
        m.generate(ids, new, compile=QUICK)
    assert dict(m.named_parameters()) == params  # the same objects
    for k, v in m.state_dict().items():
        value, stride, ptr = before[k]
        assert torch.equal(v, value) and v.stride() == stride and v.data_ptr() == ptr, k
        assert not v.is_inference(), k
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    opt.step()
    assert not torch.equal(m.head.weight, before["head.weight"][0])


def test_inputs_are_checked_once_per_call():
    m = lm()
    ids = torch.randint(0, V, (2, 5))
    with pytest.raises(
        ValueError, match=r"prompt_ids holds 61, outside the vocabulary \(ids 0 .. 60\)"
    ):
        m.generate(torch.full((1, 3), V), 2)
    with pytest.raises(ValueError, match=r"prompt_ids holds -1, outside the vocabulary"):
        m.generate(torch.tensor([[1, -1]]), 2)
    with pytest.raises(
        TypeError,
        match=r"prompt_ids must be an integer tensor \(torch.long\), got dtype torch.float32",
    ):
        m.generate(ids.float(), 2)
    with pytest.raises(ValueError, match=r"eos must be a token id in \[0, 61\) or None, got 61"):
        m.generate(ids, 2, eos=V)
    with pytest.raises(ValueError, match="attention_mask must hold only 0"):
        m.generate(ids, 2, attention_mask=torch.full((2, 5), 2))
    with pytest.raises(
        ValueError, match=r"attention_mask must have the shape of prompt_ids \(2, 5\), got \(2, 4\)"
    ):
        m.generate(ids, 2, attention_mask=torch.ones(2, 4))
    with pytest.raises(TypeError, match="compile must be a bool or a dict"):
        m.generate(ids, 2, compile="yes")
    with pytest.raises(ValueError, match="eos_check_every must be a positive int"):
        m.generate(ids, 2, eos_check_every=0)
    # a keyword generate does not take is named as generate's, with the ones it takes
    # (the generator underneath once named itself: "generate_stream() got ...")
    for bad in ("window", "temprature"):
        with pytest.raises(
            TypeError,
            match=rf"generate\(\) got an unexpected keyword argument '{bad}'; it takes "
            r"attention_mask, temperature, top_k, top_p, eos, generator, compile, eos_check_every$",
        ):
            m.generate(ids, 2, **{bad: 3})
    with pytest.raises(
        ValueError,
        match=r"prompt \(5 tokens\) \+ max_new_tokens \(92\) is longer than the position table \(96 positions\)",
    ):
        m.generate(ids, 92)
    # the stream checks when it is made, not at the first token
    with pytest.raises(ValueError, match="the vocabulary"):
        m.generate_stream(torch.full((1, 3), V), 2)


def test_forward_checks_token_ids_on_cpu():
    m = lm()
    with pytest.raises(
        ValueError, match=r"input_ids holds 70, outside the vocabulary \(ids 0 .. 60\)"
    ):
        m(torch.tensor([[1, 70]]))
    with pytest.raises(TypeError, match=r"input_ids must be an integer tensor"):
        m(torch.zeros(1, 3))
    with pytest.raises(
        ValueError, match=r"position 96 is past the position table \(96 positions\)"
    ):
        m(torch.zeros(1, 1, dtype=torch.long), positions=torch.tensor([96]))
    with pytest.raises(
        ValueError, match=r"attention_mask must have the shape of input_ids \(1, 3\)"
    ):
        m(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"attention_mask must hold only 0 \(padding\) and 1"):
        m(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.tensor([[1, 2, 1]]))


def test_position_past_the_table_through_a_static_cache():
    m = lm()
    caches = m.make_caches(1, max_length=100, static=True)
    with torch.no_grad():
        m(torch.zeros(1, 95, dtype=torch.long), caches=caches)
        m(torch.zeros(1, 1, dtype=torch.long), caches=caches)  # position 95: the last row
        with pytest.raises(ValueError, match=r"position 96 is past the position table"):
            m(torch.zeros(1, 1, dtype=torch.long), caches=caches)
