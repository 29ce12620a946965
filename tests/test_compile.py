"""torch.compile(fullgraph=True, dynamic=True): no graph break, no recompilation across sequence
lengths, and the compiled graphs compute what eager does.

The graphs are captured with dynamo's CompileCounter backend (it counts frames and runs the
captured FX graph as is), so what is tested is the tracing: fullgraph=True raises on any graph
break or data-dependent branch, and the frame count shows recompilation. Inductor itself runs
in test_generation_compiled.py.
"""

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

from multihead import CausalLM, LMConfig, MultiHeadAttention, attention
from multihead.functional import masks
from multihead.models.bert import BertConfig, BertEncoder
from multihead.modules import TransformerBlock
from multihead.modules.cache import KVCache
from multihead.modules.static_cache import StaticKVCache
from multihead.positional import ALiBi, RotaryEmbedding

# Distinct sizes: batch 2, heads 6 (kv 2 or 3), width 30, head 5 -> RoPE needs even: width 36,
# head 6. Sequence lengths avoid every other size, so no coincidence specialises a graph.
B, C, H, D = 2, 36, 6, 6
LENGTHS = (7, 11, 13)


def compiled(module):
    torch._dynamo.reset()
    counter = CompileCounter()
    return torch.compile(module, backend=counter, fullgraph=True, dynamic=True), counter


def position(name):
    return {"rope": RotaryEmbedding(D), "alibi": ALiBi(H), None: None}[name]


@pytest.mark.parametrize("pos,kv", [(None, 6), ("rope", 3), ("alibi", 1)])
def test_attention_module_one_graph_for_every_length(pos, kv):
    m = MultiHeadAttention(C, H, num_kv_heads=kv, causal=True, position=position(pos)).eval()
    f, counter = compiled(m)
    for T in LENGTHS:
        x = torch.randn(B, T, C)
        key_mask = torch.rand(B, T) > 0.3
        key_mask[:, -1] = True
        window = masks.sliding_window(T, T, 4)
        torch.testing.assert_close(f(x), m(x))
        torch.testing.assert_close(f(x, key_mask=key_mask), m(x, key_mask=key_mask))
        torch.testing.assert_close(f(x, mask=window), m(x, mask=window))
        if pos == "rope":
            p = torch.arange(T).expand(B, T) + 3
            torch.testing.assert_close(f(x, positions=p), m(x, positions=p))
    # one graph per call signature (plain, key mask, mask, positions), none per length
    assert counter.frame_count == (4 if pos == "rope" else 3)


def test_cross_attention_and_functional_one_graph():
    m = MultiHeadAttention(C, H, kdim=10, vdim=14, num_kv_heads=3).eval()
    f, counter = compiled(m)
    for T in LENGTHS:
        x, mem = torch.randn(B, T, C), torch.randn(B, T + 4, 10)
        val = torch.randn(B, T + 4, 14)
        km = torch.ones(B, T + 4, dtype=torch.bool)
        km[0, :2] = False
        torch.testing.assert_close(f(x, mem, val, key_mask=km), m(x, mem, val, key_mask=km))
    assert counter.frame_count == 1
    g, counter = compiled(attention)
    for T in LENGTHS:
        q, k, v = torch.randn(B, H, T, D), torch.randn(B, 3, T + 2, D), torch.randn(B, 3, T + 2, D)
        torch.testing.assert_close(g(q, k, v, causal=True), attention(q, k, v, causal=True))
    assert counter.frame_count == 1


@pytest.mark.parametrize(
    "pos,static", [(None, True), ("rope", True), ("alibi", True), ("rope", False)]
)
def test_cached_decoding_compiles_and_stops_recompiling(pos, static):
    """Prefill, then decode steps: a static cache is one graph per call length (prefill, step);
    the growing cache settles after its first decode steps."""
    m = MultiHeadAttention(C, H, num_kv_heads=3, causal=True, position=position(pos)).eval()
    x = torch.randn(B, 20, C)
    full = m(x)
    f, counter = compiled(m)
    cache = StaticKVCache(B, 3, D, 20) if static else KVCache(B, 3, D, max_length=20)
    out = [f(x[:, :7], cache=cache)]
    out += [f(x[:, t : t + 1], cache=cache) for t in range(7, 12)]
    warm = counter.frame_count
    out += [f(x[:, t : t + 1], cache=cache) for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(out, 1), full)
    assert counter.frame_count == warm  # no recompilation after warm-up
    if static:
        assert warm == 2  # the prefill and the step


def test_block_one_graph_for_every_length():
    blk = TransformerBlock(C, H, 50, num_kv_heads=3, norm_first=True, causal=True).eval()
    f, counter = compiled(blk)
    for T in LENGTHS:
        x = torch.randn(B, T, C)
        km = torch.ones(B, T, dtype=torch.bool)
        km[1, :3] = False
        torch.testing.assert_close(f(x, key_mask=km), blk(x, key_mask=km))
    assert counter.frame_count == 1


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_causal_lm_one_graph_for_every_length(pos):
    cfg = LMConfig(vocab_size=53, dim=C, num_layers=1, num_heads=H, num_kv_heads=3, position=pos)
    m = CausalLM(cfg).eval()
    f, counter = compiled(m)
    for T in LENGTHS:
        ids = torch.randint(0, 53, (B, T))
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1, :4] = 0
        torch.testing.assert_close(f(ids), m(ids))
        torch.testing.assert_close(f(ids, attention_mask=mask), m(ids, attention_mask=mask))
    assert counter.frame_count == 2  # with and without attention_mask


def tiny_bert():
    cfg = BertConfig(
        vocab_size=57,
        hidden_size=C,
        num_hidden_layers=2,
        num_attention_heads=H,
        intermediate_size=50,
        max_position_embeddings=40,
    )
    return BertEncoder(cfg).eval()


def test_bert_encoder_one_graph_for_every_length():
    bert = tiny_bert()
    f, counter = compiled(bert)
    for T in LENGTHS:
        ids = torch.randint(0, 57, (B, T))
        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, T - 3 :] = 0
        types = torch.randint(0, 2, (B, T))
        got = f(ids, mask, types).last_hidden_state
        torch.testing.assert_close(got, bert(ids, mask, types).last_hidden_state)
    assert counter.frame_count == 1
