"""Blocks, stacks, the causal LM and generation: cached decoding equals the full forward."""

import pytest
import torch

from multihead.modules import (
    CausalLM,
    EncoderDecoder,
    LMConfig,
    RMSNorm,
    StackConfig,
    TransformerBlock,
)
from multihead.modules.cache import CrossKVCache, KVCache


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("norm,mlp", [("layernorm", "gelu"), ("rmsnorm", "swiglu")])
def test_block_variants_match_manual_composition(norm_first, norm, mlp):
    torch.manual_seed(0)
    blk = TransformerBlock(16, 4, 32, norm_first=norm_first, norm=norm, mlp=mlp).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    if norm_first:
        h = x + blk.attn(blk.norm1(x))
        expected = h + blk.ffn(blk.norm2(h))
    else:
        h = blk.norm1(x + blk.attn(x))
        expected = blk.norm2(h + blk.ffn(h))
    torch.testing.assert_close(blk(x), expected)
    assert isinstance(blk.norm1, RMSNorm if norm == "rmsnorm" else torch.nn.LayerNorm)


def test_rmsnorm_hand_computed():
    n = RMSNorm(2, eps=0.0)
    torch.testing.assert_close(
        n(torch.tensor([[3.0, 4.0]])), torch.tensor([[3.0, 4.0]]) / (12.5**0.5)
    )


def test_cross_attention_decoder_block_with_caches():
    torch.manual_seed(0)
    blk = (
        TransformerBlock(16, 4, 32, norm_first=True, causal=True, cross_attention=True)
        .double()
        .eval()
    )
    x, memory = (
        torch.randn(2, 6, 16, dtype=torch.float64),
        torch.randn(2, 9, 16, dtype=torch.float64),
    )
    full = blk(x, memory=memory)
    cache, cross = KVCache(2, 4, 4, dtype=torch.float64), CrossKVCache()
    steps = [
        blk(x[:, t : t + 1], memory=memory if t == 0 else None, cache=cache, cross_cache=cross)
        for t in range(6)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full)
    with pytest.raises(ValueError, match="pass memory"):
        blk(x)


def test_encoder_decoder_cached_decoding_equals_teacher_forcing():
    torch.manual_seed(0)
    cfg = StackConfig(dim=24, num_layers=2, num_heads=4, ffn_dim=48, num_kv_heads=2)
    m = EncoderDecoder(50, cfg, cfg).double().eval()
    src, tgt = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 5))
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    full = m(src, tgt, src_mask=src_mask)
    memory = m.encode(src, src_mask)
    caches = [KVCache(2, 2, 6, dtype=torch.float64) for _ in range(2)]
    cross = [CrossKVCache() for _ in range(2)]
    steps = [
        m.head(
            m.decoder(
                m._embed(tgt[:, t : t + 1], start=t),
                memory,
                memory_key_mask=src_mask,
                caches=caches,
                cross_caches=cross,
            )
        )
        for t in range(5)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full)
    assert m.greedy(src, 1, 4, src_mask=src_mask).shape == (2, 5)


def naive_greedy(model, ids, n):
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@pytest.mark.parametrize("position,kv", [("learned", None), ("rope", 2), ("alibi", 1)])
def test_lm_cached_generation_equals_recomputation(position, kv):
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=60,
        dim=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=kv,
        position=position,
        tie_embeddings=False,
        max_positions=64,
    )
    m = CausalLM(cfg).eval()
    for p in m.parameters():  # spread the logits so greedy choices are not ties
        torch.nn.init.normal_(p, std=0.3)
    ids = torch.randint(0, 60, (2, 6))
    with torch.no_grad():
        expected = naive_greedy(m, ids, 10)
        full = m(expected)
        caches = m.make_caches(2, max_length=16)
        chunks = [m(expected[:, :6], caches=caches)] + [
            m(expected[:, t : t + 1], caches=caches) for t in range(6, 16)
        ]
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-4, rtol=1e-4)
    assert torch.equal(m.generate(ids, 10), expected)
    streamed = torch.stack(list(m.generate_stream(ids, 10)), 1)
    assert torch.equal(streamed, expected[:, 6:])


def test_left_padded_batch_equals_each_prompt_alone():
    torch.manual_seed(0)
    m = CausalLM(
        LMConfig(vocab_size=60, dim=32, num_layers=2, num_heads=4, max_positions=64)
    ).eval()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    prompts = [torch.randint(0, 60, (n,)) for n in (7, 3, 5)]
    P = 7
    batch = torch.zeros(3, P, dtype=torch.long)
    mask = torch.zeros(3, P, dtype=torch.long)
    for i, p in enumerate(prompts):
        batch[i, P - len(p) :], mask[i, P - len(p) :] = p, 1
    out = m.generate(batch, 8, attention_mask=mask)
    for i, p in enumerate(prompts):
        assert torch.equal(out[i, P:], m.generate(p[None], 8)[0, len(p) :])


def test_sampling_controls():
    torch.manual_seed(0)
    m = CausalLM(
        LMConfig(vocab_size=60, dim=32, num_layers=1, num_heads=4, max_positions=64)
    ).eval()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ids = torch.randint(0, 60, (2, 4))
    greedy = m.generate(ids, 6)
    assert torch.equal(m.generate(ids, 6, temperature=1.0, top_k=1), greedy)
    assert torch.equal(m.generate(ids, 6, temperature=0.7, top_p=1e-6), greedy)
    a = m.generate(ids, 6, temperature=1.0, generator=torch.Generator().manual_seed(3))
    b = m.generate(ids, 6, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    eos = int(greedy[0, 5])  # the first row's second new token
    out = m.generate(ids, 6, eos=eos)
    assert (out[0, 5:] == eos).all()


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive int, got 0"),
        (dict(max_new_tokens=2, top_k=0), "top_k must be a positive int"),
        (dict(max_new_tokens=2, top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(max_new_tokens=2, top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(max_new_tokens=2, temperature=-1.0), "temperature must be >= 0"),
        (dict(max_new_tokens=100), r"longer than the position table \(64 positions\)"),
    ],
)
def test_generation_errors(kwargs, pattern):
    m = CausalLM(LMConfig(vocab_size=60, dim=32, num_layers=1, num_heads=4, max_positions=64))
    with pytest.raises(ValueError, match=pattern):
        m.generate(torch.zeros(1, 5, dtype=torch.long), **kwargs)


def test_lm_cache_and_position_errors():
    m = CausalLM(LMConfig(vocab_size=60, dim=32, num_layers=2, num_heads=4, max_positions=8))
    with pytest.raises(ValueError, match="built for batch 3, got 1"):
        m(torch.zeros(1, 2, dtype=torch.long), caches=m.make_caches(3))
    with pytest.raises(ValueError, match="expected 2 caches"):
        m(torch.zeros(1, 2, dtype=torch.long), caches=m.make_caches(1)[:1])
    with pytest.raises(ValueError, match=r"position 8 is past the position table \(8 positions\)"):
        m(torch.zeros(1, 9, dtype=torch.long))
    caches = m.make_caches(1, max_length=4)
    with pytest.raises(ValueError, match="do not fit a cache of max_length 4"):
        m(torch.zeros(1, 5, dtype=torch.long), caches=caches)
