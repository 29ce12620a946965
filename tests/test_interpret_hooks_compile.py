"""Hook points cost torch.compile nothing: models with hook points trace as one graph
(fullgraph=True) with no hooks active, and also while a hook session is open in the calling
context (compiled graphs carry no hooks; they are decided at trace time)."""

import pytest
import torch
from torch import nn

from multihead import CausalLM, LMConfig
from multihead.compat import replace_attention
from multihead.interpret import run_with_cache
from multihead.modules import Encoder, StackConfig
from multihead.pretrained import BertConfig, BertEncoder

HOOK_CODE = ("hook_points.py", "attend.py", "/interpret/")


def compiled(model):
    torch._dynamo.reset()
    # The "eager" backend runs dynamo's tracing (where graph breaks happen) without inductor.
    return torch.compile(model, fullgraph=True, backend="eager")


def lm(position):
    cfg = LMConfig(vocab_size=41, dim=24, num_layers=2, num_heads=4, ffn_dim=36, position=position)
    return CausalLM(cfg).eval()


def bert():
    return BertEncoder(BertConfig(41, 30, 2, 5, 44, max_position_embeddings=32)).eval()


@pytest.mark.parametrize(
    "make, inputs, kwargs",
    [
        (lambda: lm("alibi"), lambda: (torch.randint(0, 41, (2, 9)),), {}),
        (
            lambda: Encoder(StackConfig(dim=24, num_layers=2, num_heads=3, ffn_dim=40)).eval(),
            lambda: (torch.randn(2, 9, 24),),
            {},
        ),
        (bert, lambda: (torch.randint(0, 41, (2, 9)),), {}),
        (bert, lambda: (torch.randint(0, 41, (13,)),), {"lengths": [6, 3, 4]}),
    ],
    ids=["causal-lm-alibi", "encoder", "bert", "bert-packed"],
)
def test_fullgraph_compile_with_and_without_an_open_session(make, inputs, kwargs):
    model, x = make(), inputs()
    with torch.no_grad():
        expected = model(*x, **kwargs)
        out = compiled(model)(*x, **kwargs)  # fullgraph=True raises on any graph break
        # The same, traced while a cache of every activation is open for this model: the
        # compiled graph has no hooks and no break; the eager model behind it is observed.
        torch._dynamo.reset()
        seen = []

        def observe(activation, name):
            seen.append(name)

        from multihead.interpret import hooks

        with hooks(model, [(lambda n: True, observe)]):
            traced = compiled(model)(*x, **kwargs)
        assert seen == []  # compiled code carries no hooks
        _, cache = run_with_cache(
            compiled(model), *x, **kwargs, names=lambda n: n.endswith("hook_z")
        )
    assert len(cache) == 2  # run_with_cache unwraps a compiled model: its eager forward is seen
    first, second = (out, traced) if isinstance(out, torch.Tensor) else (out[0], traced[0])
    reference = expected if isinstance(expected, torch.Tensor) else expected[0]
    torch.testing.assert_close(first, reference, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(second, reference, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "make, inputs",
    [
        (lambda: lm("learned"), lambda: (torch.randint(0, 41, (2, 9)),)),
        (lambda: lm("rope"), lambda: (torch.randint(0, 41, (2, 9)),)),
        (bert, lambda: (torch.randint(0, 41, (2, 9)), torch.ones(2, 9, dtype=torch.long))),
    ],
    ids=["causal-lm-learned", "causal-lm-rope", "bert-attention-mask"],
)
def test_remaining_graph_breaks_come_from_no_hook_code(make, inputs):
    """Learned and RoPE CausalLMs read the largest position (lm.py's table check) and BERT
    checks its attention mask's values (masks.from_hf_padding): those break the graph; nothing
    in the hook machinery adds a break."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(make())(*inputs())
    for reason in explanation.break_reasons:
        files = [frame.filename for frame in reason.user_stack]
        assert files and not any(part in f for f in files for part in HOOK_CODE), files


def test_drop_in_attention_compiles_without_breaks():
    layer = replace_attention(nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True))
    attn = layer.self_attn.eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        out, _ = compiled(attn)(x, x, x, need_weights=False)
    torch.testing.assert_close(out, attn(x, x, x, need_weights=False)[0])
