"""Sequence parallelism inside the modules (`sequence_parallel`): every self-attention runs as ring
attention over gloo worlds of 2 and 4 processes, each rank holding a chunk of the sequence, and
the whole model equals one process: outputs per chunk, the loss summed over ranks, and weight
gradients summed over ranks, for CausalLM (learned, RoPE, ALiBi positions; GQA; left padding;
fp32 and fp64), a standalone MultiHeadAttention (RoPE at default and given positions, key
masks), Encoder and Decoder stacks (cross-attention to a whole memory), both layouts, T not
divisible by the ranks. Also: hook points on the chunk, seeded dropout that does not depend on
the number of ranks, and refusals that name what is not available.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers_parallel import run_world
from multihead import CausalLM, LMConfig, MultiHeadAttention
from multihead.interpret import capture, run_with_cache
from multihead.models.bert import BertConfig, BertEncoder
from multihead.modules import Decoder, Encoder, StackConfig
from multihead.parallel import sequence_parallel, shard_sequence
from multihead.positional import ALiBi, RotaryEmbedding

from conftest import assert_close


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    try:
        assert_close(got, want)
    except AssertionError as err:
        raise AssertionError(f"{what}: {err}") from None


def summed_grads_match(model: nn.Module, ref: nn.Module, what: str) -> None:
    """Each rank's weight gradients cover its chunk: their sum over ranks is one process's."""
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert p.grad is not None, f"{what}: no gradient for {name}"
        g = p.grad.clone()
        dist.all_reduce(g)
        check(g, r.grad, f"{what}: grad of {name}")


def check_causal_lm(rank: int, world: int, position: str, layout: str, dtype) -> None:
    what = f"P={world} {position} {layout} {dtype}"
    torch.manual_seed(0)
    config = LMConfig(vocab_size=37, dim=24, num_layers=2, num_heads=4, num_kv_heads=2,
                      ffn_dim=40, position=position, max_positions=32)  # fmt: skip
    ref = CausalLM(config).to(dtype)
    model = sequence_parallel(copy.deepcopy(ref), layout=layout)
    T = 19  # not divisible by 2 or 4
    ids = torch.randint(37, (3, T + 1))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    mask = torch.ones(3, T, dtype=torch.bool)
    mask[1, :6] = False  # left padding longer than one chunk at P = 4
    mask[2, :1] = False
    logits = ref(inputs, attention_mask=mask)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    loss.backward()

    def shard(t: torch.Tensor) -> torch.Tensor:
        return shard_sequence(t, world, rank, dim=1, layout=layout)

    mine = model(shard(inputs), attention_mask=shard(mask))
    check(mine, shard(logits), f"{what}: logits")
    my_loss = F.cross_entropy(mine.flatten(0, 1), shard(labels).flatten(), reduction="sum")
    my_loss.backward()
    total = my_loss.detach().clone()
    dist.all_reduce(total)
    check(total, loss.detach(), f"{what}: loss")
    summed_grads_match(model, ref, what)


def check_attention_module(rank: int, world: int) -> None:
    """Standalone: RoPE at the layout's positions (default) and at given positions, ALiBi,
    non-causal with a key mask, GQA; gradients of the chunk's input too."""
    for layout in ("zigzag", "contiguous"):
        for position in (RotaryEmbedding(6), ALiBi(6)):
            torch.manual_seed(1)
            ref = MultiHeadAttention(36, 6, num_kv_heads=3, position=position).double()
            model = sequence_parallel(copy.deepcopy(ref), layout=layout)
            B, T = 2, 13
            x = torch.randn(B, T, 36, dtype=torch.float64, requires_grad=True)
            key_mask = torch.rand(B, T) < 0.7
            key_mask[:, 3] = True
            grad = torch.randn(B, T, 36, dtype=torch.float64)

            def shard(t, layout=layout):
                return shard_sequence(t, world, rank, dim=1, layout=layout)

            positions_options = [None]
            if isinstance(position, RotaryEmbedding):
                positions_options.append(torch.randint(50, (B, T)))  # given per row
            for positions in positions_options:
                ref.zero_grad()
                model.zero_grad()
                out = ref(x, key_mask=key_mask, positions=positions)
                out.backward(grad)
                x_r = shard(x.detach()).requires_grad_()
                given = None if positions is None else shard(positions)
                mine = model(x_r, key_mask=shard(key_mask), positions=given)
                mine.backward(shard(grad))
                what = f"P={world} MHA {type(position).__name__} {layout} positions={given}"
                check(mine, shard(out), what)
                check(x_r.grad, shard(x.grad), f"{what}: input grad")
                summed_grads_match(model, ref, what)
                x.grad = None


def check_stacks(rank: int, world: int) -> None:
    """An Encoder (bidirectional, key mask) and a Decoder (causal self-attention over the ring,
    cross-attention of the chunk's queries to the whole memory)."""
    torch.manual_seed(2)
    config = StackConfig(dim=20, num_layers=2, num_heads=4, ffn_dim=28, num_kv_heads=2)
    layout = "zigzag"

    def shard(t):
        return shard_sequence(t, world, rank, dim=1, layout=layout)

    encoder = Encoder(config)
    model = sequence_parallel(copy.deepcopy(encoder), layout=layout)
    x = torch.randn(2, 11, 20)
    key_mask = torch.ones(2, 11, dtype=torch.bool)
    key_mask[0, 8:] = False
    out = encoder(x, key_mask=key_mask)
    out.sum().backward()
    mine = model(shard(x), key_mask=shard(key_mask))
    mine.sum().backward()
    check(mine, shard(out), f"P={world} Encoder")
    summed_grads_match(model, encoder, f"P={world} Encoder")

    decoder = Decoder(config)
    model = sequence_parallel(copy.deepcopy(decoder), layout=layout)
    assert model.layers[0].cross_attn._sequence_parallel is None  # stays whole
    memory = torch.randn(2, 5, 20)
    out = decoder(x, memory)
    out.sum().backward()
    mine = model(shard(x), memory)
    mine.sum().backward()
    check(mine, shard(out), f"P={world} Decoder")
    summed_grads_match(model, decoder, f"P={world} Decoder")


def check_hooks_dropout_refusals(rank: int, world: int) -> None:
    torch.manual_seed(3)
    ref = MultiHeadAttention(24, 4, causal=True, position=RotaryEmbedding(6))
    model = sequence_parallel(copy.deepcopy(ref))
    x = torch.randn(2, 12, 24)
    x_r = shard_sequence(x, world, rank, dim=1, layout="zigzag")
    # Hook points show the chunk: equal to the chunk of the unsharded module's.
    names = ["hook_q", "hook_rot_k", "hook_z", "hook_result"]
    _, whole = run_with_cache(ref, x, names=names)
    _, mine = run_with_cache(model, x_r, names=names)
    for name in names:
        check(mine[name], shard_sequence(whole[name], world, rank, dim=1, layout="zigzag"), name)
    # What needs the (T, T) pattern is refused.
    with pytest.raises(ValueError, match="need the \\(T, T\\) attention pattern"):
        run_with_cache(model, x_r, names="hook_pattern")
    with pytest.raises(ValueError, match="need the \\(T, T\\) attention pattern"), capture(model):
        model(x_r)
    refusals = [
        (dict(mask=torch.ones(6, 6, dtype=torch.bool)), "mask cannot be used"),
        (dict(return_weights=True), "return_weights cannot be used"),
        (dict(lengths=[6]), "lengths cannot be used"),
    ]
    for kwargs, message in refusals:
        with pytest.raises(ValueError, match=message):
            model(x_r, **kwargs)
    with pytest.raises(ValueError, match="key/value \\(cross-attention\\) cannot be used"):
        model(x_r, torch.randn(2, 4, 24))
    with pytest.raises(ValueError, match="already sequence-parallel"):
        sequence_parallel(model)
    with pytest.raises(ValueError, match="BertEncoder adds absolute positions"):
        sequence_parallel(BertEncoder(BertConfig(11, 8, 1, 2, 16)))
    with pytest.raises(ValueError, match="layout must be one of"):
        sequence_parallel(copy.deepcopy(ref), layout="striped")
    windowed = CausalLM(LMConfig(vocab_size=11, dim=8, num_layers=1, num_heads=2, sliding_window=3))
    with pytest.raises(ValueError, match="sliding-window attention"):
        sequence_parallel(windowed)
    lm = sequence_parallel(CausalLM(LMConfig(vocab_size=11, dim=8, num_layers=1, num_heads=2)))
    ids = torch.randint(11, (1, 3))
    with pytest.raises(ValueError, match="caches cannot be used under sequence parallelism"):
        lm(ids, caches=lm.make_caches(1))
    with pytest.raises(ValueError, match="last_only cannot be used"):
        lm(ids, last_only=True)

    # Dropout: the ring's mask depends on the seed and global positions only, so P ranks and
    # one rank holding the whole sequence drop the same entries.
    alone = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group
    drop = MultiHeadAttention(24, 4, dropout=0.4, causal=True).train()
    ring_model = sequence_parallel(copy.deepcopy(drop))
    solo_model = sequence_parallel(copy.deepcopy(drop), alone)
    torch.manual_seed(9)
    mine = ring_model(x_r)
    torch.manual_seed(9)
    solo = solo_model(x)
    check(mine, shard_sequence(solo, world, rank, dim=1, layout="zigzag"), "dropout")
    assert not torch.allclose(solo, drop.eval()(x))  # something was dropped


def check_world(rank: int, world: int) -> None:
    cases = [("learned", "zigzag", torch.float64), ("rope", "contiguous", torch.float32),
             ("alibi", "zigzag", torch.float32), ("rope", "zigzag", torch.float64)]  # fmt: skip
    for position, layout, dtype in cases:
        check_causal_lm(rank, world, position, layout, dtype)
    check_attention_module(rank, world)
    check_stacks(rank, world)
    check_hooks_dropout_refusals(rank, world)


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_model_equals_one_process(world):
    run_world(check_world, world, timeout=300)


def check_larger(rank: int, world: int) -> None:
    torch.manual_seed(4)
    config = LMConfig(vocab_size=301, dim=96, num_layers=3, num_heads=8, num_kv_heads=2,
                      ffn_dim=256, position="rope", mlp="swiglu", norm="rmsnorm",
                      max_positions=512)  # fmt: skip
    ref = CausalLM(config)
    model = sequence_parallel(copy.deepcopy(ref), layout="zigzag", block_size=48)
    ids = torch.randint(301, (2, 258))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    logits = ref(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    loss.backward()
    mine = model(shard_sequence(inputs, world, rank, dim=1, layout="zigzag"))
    labels_r = shard_sequence(labels, world, rank, dim=1, layout="zigzag")
    F.cross_entropy(mine.flatten(0, 1), labels_r.flatten(), reduction="sum").backward()
    check(mine, shard_sequence(logits, world, rank, dim=1, layout="zigzag"), "larger logits")
    summed_grads_match(model, ref, "larger")


@pytest.mark.slow
def test_sequence_parallel_larger_model():
    run_world(check_larger, 4, timeout=600)
