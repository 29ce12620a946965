"""Tensor-parallel heads on gloo worlds of 2 and 4 processes against the unsharded model on the
same weights: CausalLM (RoPE, ALiBi, learned positions; GQA with kv heads replicated where the
ranks outnumber them; SwiGLU and GELU MLPs; left padding), KV-cache decoding and generate, the
BERT encoder (padded and packed), cross-attention with separate projections and attention
weights; hidden states and gradients gathered back to full shape within 1e-5, logits (up to ~60)
within the fp32 tolerance (atol 1e-5, rtol 1e-4). Also: FSDP2 over the data axis of a 2-D mesh trains to the same parameters as one
process, the per-rank parameter memory, and clear refusals.

Every rank builds the same model from one seed; checks are grouped per world.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from helpers_parallel import run_world
from multihead import CausalLM, LMConfig, MultiHeadAttention
from multihead.bench.tensor_parallel import parameter_bytes
from multihead.interpret import run_with_cache, run_with_hooks
from multihead.models.bert import BertConfig, BertEncoder
from multihead.parallel import full_grads, full_state_dict, sequence_parallel, tensor_parallel
from multihead.parallel.heads import HeadSplit

from conftest import assert_close


def assert_within(got: torch.Tensor, want: torch.Tensor, what: str, strict: bool = False) -> None:
    """The project's fp32 tolerance (atol 1e-5, rtol 1e-4), or `strict`: |difference| <= 1e-5
    everywhere (for unit-sized values: hidden states, gradients)."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    try:
        if strict:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        else:
            assert_close(got, want)
    except AssertionError as err:
        raise AssertionError(f"{what}: {err}") from None


def assert_grads(model: nn.Module, ref: nn.Module, what: str) -> None:
    grads = full_grads(model)
    for name, p in ref.named_parameters():
        got = grads[name]
        assert got is not None, f"{what}: no gradient for {name}"
        assert_within(got, p.grad, f"{what}: grad of {name}", strict=True)


LM_CASES = [
    # (position, H, Hkv, mlp, norm): Hkv = 2 at tp = 4 replicates each kv head to two ranks;
    # Hkv = 1 (multi-query) to every rank.
    # (Qwen2-like: q/k/v biases only, head_dim apart from dim / H, sliding windows on layer 0)
    dict(
        position="rope",
        num_heads=8,
        num_kv_heads=2,
        mlp="swiglu",
        norm="rmsnorm",
        head_dim=4,
        qkv_bias=True,
        out_bias=False,
        mlp_bias=False,
        sliding_window=5,
        full_attention_layers=(1,),
    ),
    dict(position="alibi", num_heads=8, num_kv_heads=8, mlp="gelu", norm="layernorm"),
    dict(position="learned", num_heads=8, num_kv_heads=1, mlp="gelu", norm="layernorm"),
]


def make_lm(case: dict) -> CausalLM:
    torch.manual_seed(0)
    config = LMConfig(vocab_size=37, dim=48, num_layers=2, ffn_dim=40, max_positions=32, **case)
    return CausalLM(config)


def lm_inputs():
    torch.manual_seed(1)
    ids = torch.randint(37, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, :4] = False  # left padding
    mask[2, :1] = False
    return ids, mask


def check_causal_lm(mesh, world: int, case: dict) -> None:
    ref = make_lm(case)
    model = tensor_parallel(copy.deepcopy(ref), mesh)
    what = f"tp={world} {case['position']} Hkv={case['num_kv_heads']}"
    attn = model.attention(0)
    assert (attn.num_heads, attn.head_dim) == (8 // world, case.get("head_dim", 6))
    assert attn.num_kv_heads == max(case["num_kv_heads"] // world, 1)
    ids, mask = lm_inputs()
    with torch.no_grad():  # the final hidden states (unit-sized, unlike logits of up to ~60)
        names = "ln_final.hook_normalized"
        _, hidden = run_with_cache(model, ids, attention_mask=mask, names=names)
        _, hidden_ref = run_with_cache(ref, ids, attention_mask=mask, names=names)
    assert_within(hidden[names], hidden_ref[names], f"{what}: hidden states", strict=True)
    logits, expected = model(ids, attention_mask=mask), ref(ids, attention_mask=mask)
    assert_within(logits, expected, f"{what}: logits")
    target = torch.randint(37, ids.shape)
    for out in (logits, expected):
        F.cross_entropy(out.flatten(0, 1), target.flatten()).backward()
    assert_grads(model, ref, what)

    # KV-cache decoding: the caches hold the rank's kv heads; prefill, then one token at a time.
    caches, ref_caches = model.make_caches(3, max_length=16), ref.make_caches(3, max_length=16)
    assert caches[0].num_kv_heads == attn.num_kv_heads
    with torch.no_grad():
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        for start, stop in ((0, 7), (7, 8), (8, 9), (9, 11)):
            kwargs = dict(attention_mask=mask[:, start:stop], positions=positions[:, start:stop])
            got = model(ids[:, start:stop], caches=caches, **kwargs)
            want = ref(ids[:, start:stop], caches=ref_caches, **kwargs)
            assert_within(got, want, f"{what}: cached logits at {start}")
    prompt, prompt_mask = ids[:, :6], mask[:, :6]
    tokens = model.generate(prompt, 5, attention_mask=prompt_mask)
    assert torch.equal(tokens, ref.generate(prompt, 5, attention_mask=prompt_mask)), what

    # The gathered state loads into the unsharded model as it was.
    fresh = CausalLM(ref.config)
    fresh.load_state_dict(full_state_dict(model))
    for name, t in ref.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], t), f"{what}: full_state_dict[{name}]"


def check_bert(mesh, world: int) -> None:
    torch.manual_seed(2)
    config = BertConfig(vocab_size=41, hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=36, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)  # fmt: skip
    ref = BertEncoder(config)
    model = tensor_parallel(copy.deepcopy(ref), mesh)
    ids = torch.randint(41, (2, 9))
    attention_mask = torch.ones(2, 9, dtype=torch.long)
    attention_mask[1, 6:] = 0  # right padding, as BERT tokenizers pad
    out = model(ids, attention_mask).last_hidden_state
    expected = ref(ids, attention_mask).last_hidden_state
    assert_within(out, expected, f"tp={world} BERT: hidden states")
    weight = torch.randn(out.shape)
    (out * weight).sum().backward()
    (expected * weight).sum().backward()
    assert_grads(model, ref, f"tp={world} BERT")
    packed = torch.randint(41, (12,))
    with torch.no_grad():
        got = model(packed, lengths=[5, 7]).last_hidden_state
        want = ref(packed, lengths=[5, 7]).last_hidden_state
    assert_within(got, want, f"tp={world} BERT packed")


def check_cross_attention(mesh, world: int) -> None:
    """Separate projections (kdim, vdim), GQA with Hkv = 2 (replicated at tp = 4), a boolean
    mask and a key mask, attention weights of every head, gradients of all three inputs."""
    torch.manual_seed(3)
    ref = MultiHeadAttention(20, 4, num_kv_heads=2, head_dim=7, kdim=12, vdim=10)
    model = tensor_parallel(copy.deepcopy(ref), mesh)
    assert model.num_heads == 4 // world
    q = torch.randn(2, 5, 20, requires_grad=True)
    k = torch.randn(2, 9, 12, requires_grad=True)
    v = torch.randn(2, 9, 10, requires_grad=True)
    key_mask = torch.rand(2, 9) < 0.7
    key_mask[:, 0] = True
    mask = torch.rand(5, 9) < 0.8
    results = []
    for m in (model, ref):
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        out, weights = m(*inputs, mask=mask, key_mask=key_mask, return_weights=True)
        ((out**2).sum() + (weights * torch.arange(9.0)).sum()).backward()
        results.append((out, weights, *(t.grad for t in inputs)))
    for name, got, want in zip(("out", "weights", "dq", "dk", "dv"), *results, strict=True):
        assert_within(got, want, f"tp={world} cross-attention {name}")
    assert_grads(model, ref, f"tp={world} cross-attention")


def check_hooks_and_refusals(mesh, world: int) -> None:
    torch.manual_seed(4)
    model = tensor_parallel(MultiHeadAttention(24, 4, num_kv_heads=1), mesh)
    x = torch.randn(2, 5, 24, requires_grad=True)
    # Hook points show this rank's heads ...
    _, cache = run_with_cache(model, x, names="hook_z")
    assert cache["hook_z"].shape == (2, 5, 4 // world, 6)
    # ... but hook_result would project through a split weight: refused.
    with pytest.raises(ValueError, match="hook_result is not available under tensor parallel"):
        run_with_hooks(model, x, fwd_hooks=[("hook_result", lambda t, name: t)])
    # Cross-attention through the packed weight with replicated kv heads cannot train.
    memory = torch.randn(2, 3, 24, requires_grad=True)
    with pytest.raises(ValueError, match="packed in_proj with kv heads replicated"):
        model(x, memory)
    with torch.no_grad():
        model(x, memory)  # inference is fine
    with pytest.raises(ValueError, match="already tensor-parallel"):
        tensor_parallel(model, mesh)
    # Not both kinds of parallelism on one module, in either order.
    with pytest.raises(ValueError, match="tensor-parallel attention combined with sequence"):
        sequence_parallel(model)
    with pytest.raises(ValueError, match="combined with sequence parallelism are not supported"):
        tensor_parallel(sequence_parallel(MultiHeadAttention(24, 4)), mesh)
    bad = nn.ModuleDict({"a": MultiHeadAttention(24, 4), "b": MultiHeadAttention(18, 6)})
    before = {n: p.clone() for n, p in bad.state_dict().items()}
    if world == 4:
        with pytest.raises(ValueError, match=r"b: .*num_heads \(6\) must be a multiple"):
            tensor_parallel(bad, mesh)
        for n, p in bad.state_dict().items():  # checked before anything changed
            assert type(p) is torch.Tensor and torch.equal(p, before[n])
    mlp_bad = CausalLM(LMConfig(vocab_size=11, dim=8, num_layers=1, num_heads=4, ffn_dim=6))
    if world == 4:
        with pytest.raises(ValueError, match=r"hidden width \(6\) must be a multiple of"):
            tensor_parallel(mlp_bad, mesh)


def check_memory(mesh, world: int) -> None:
    """Per-rank parameter memory: 1/tp of the attention and MLP weights (kv heads, when
    replicated, stay whole per rank); embeddings, norms and the head replicated."""
    full = make_lm(dict(position="rope", num_heads=8, num_kv_heads=8))
    model = tensor_parallel(copy.deepcopy(full), mesh)
    whole, mine = parameter_bytes(full), parameter_bytes(model)
    assert whole["attention weights"] == world * mine["attention weights"]
    assert whole["MLP weights"] == world * mine["MLP weights"]
    assert whole["other"] == mine["other"]
    gqa = tensor_parallel(make_lm(dict(position="rope", num_heads=8, num_kv_heads=2)), mesh)
    C, D, kv_local = 48, 6, max(2 // world, 1)
    per_layer = (8 // world + 2 * kv_local) * D * C + C * (8 // world) * D  # in_proj + out_proj
    assert parameter_bytes(gqa)["attention weights"] == 2 * per_layer * 4


def check_world(rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    for case in LM_CASES:
        check_causal_lm(mesh, world, case)
    check_bert(mesh, world)
    check_cross_attention(mesh, world)
    check_hooks_and_refusals(mesh, world)
    check_memory(mesh, world)


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_equals_unsharded(world):
    run_world(check_world, world, timeout=300)


def check_fsdp_2d(rank: int, world: int, steps: int) -> None:
    """dp = 2 x tp = 2: FSDP2 over the data axis, heads over the other; SGD with momentum on a
    CausalLM with one kv head (replicated to both tp ranks) ends where one process ends."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    ref = make_lm(dict(position="rope", num_heads=4, num_kv_heads=1, mlp="swiglu"))
    model = tensor_parallel(copy.deepcopy(ref), mesh["tp"])
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    torch.manual_seed(5)
    ids = torch.randint(37, (4, 13))
    dp = mesh["dp"].get_local_rank()
    mine = ids[2 * dp : 2 * dp + 2]  # each data-parallel rank: half of the batch

    def loss_of(m: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = m(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.3, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    for _ in range(steps):
        for m, o, batch in ((ref, opt_ref, ids), (model, opt, mine)):
            o.zero_grad()
            loss_of(m, batch).backward()
            o.step()
    state = full_state_dict(model)
    for name, t in ref.state_dict().items():
        assert_within(state[name], t, f"after {steps} steps: {name}")


def test_fsdp2_over_data_and_tensor_parallel_heads_trains_like_one_process():
    run_world(check_fsdp_2d, 4, 3, timeout=300)


@pytest.mark.parametrize(
    ("H", "Hkv", "tp"), [(8, 8, 4), (8, 2, 4), (8, 1, 4), (6, 3, 3), (12, 4, 2), (4, 2, 4)]
)
def test_head_split_covers_every_head_once(H, Hkv, tp):
    D, C = 3, 5
    packed = torch.randn((H + 2 * Hkv) * D, C)
    q_rows, kv_rows = torch.randn(H * D, C), torch.randn(Hkv * D, C)
    splits = [HeadSplit.plan(H, Hkv, D, tp, r) for r in range(tp)]
    assert sorted(h for s in splits for h in s.query_heads()) == list(range(H))
    for s in splits:
        # Every query head of the rank reads a kv head the rank holds, in the same grouped
        # order as the unsharded module: local q head i reads local kv head i // (h / hkv).
        group = s.local_heads // s.local_kv_heads
        for i, h in enumerate(s.query_heads()):
            assert s.kv_heads()[i // group] == h // (H // Hkv)
    assert torch.equal(splits[0].full_packed([packed[s.packed_rows()] for s in splits]), packed)
    assert torch.equal(splits[0].full_query([q_rows[s.query_rows()] for s in splits]), q_rows)
    assert torch.equal(splits[0].full_kv([kv_rows[s.kv_rows()] for s in splits]), kv_rows)


@pytest.mark.parametrize(
    ("H", "Hkv", "tp", "message"),
    [
        (6, 6, 4, r"num_heads \(6\) must be a multiple of the tensor-parallel size \(4\)"),
        (8, 6, 4, r"num_kv_heads \(6\) must be a multiple"),
        (12, 3, 4, r"num_kv_heads must divide the tensor-parallel size"),
    ],
)
def test_head_split_refuses_partial_heads(H, Hkv, tp, message):
    with pytest.raises(ValueError, match=message):
        HeadSplit.plan(H, Hkv, 4, tp, 0)


def test_tensor_parallel_needs_a_1d_mesh():
    with pytest.raises(TypeError, match=r"mesh must be a 1-D torch\.distributed\.DeviceMesh"):
        tensor_parallel(MultiHeadAttention(8, 2), "cpu")  # type: ignore[arg-type]


def check_larger(rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(6)
    config = LMConfig(vocab_size=301, dim=192, num_layers=4, num_heads=12, num_kv_heads=2,
                      ffn_dim=512, position="rope", mlp="swiglu", norm="rmsnorm",
                      max_positions=128)  # fmt: skip
    ref = CausalLM(config)
    model = tensor_parallel(copy.deepcopy(ref), mesh)
    ids = torch.randint(301, (2, 97))
    logits, expected = model(ids), ref(ids)
    assert_within(logits, expected, "larger: logits")
    for out in (logits, expected):
        F.cross_entropy(out.flatten(0, 1)[:-1], ids.flatten()[1:]).backward()
    assert_grads(model, ref, "larger")


@pytest.mark.slow
def test_tensor_parallel_larger_model():
    run_world(check_larger, 4, timeout=600)
