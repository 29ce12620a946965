"""generate(compile=True) with the default compiler (inductor): the generated code gives the
tokens eager generation gives, and the prefill and the decode step compile once each."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from multihead import CausalLM, LMConfig


@pytest.mark.slow
def test_inductor_generation_equals_eager_and_compiles_once():
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=61, dim=24, num_layers=1, num_heads=4, num_kv_heads=2, position="rope"
    )
    m = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(std=0.4)
    torch._dynamo.reset()
    counters.clear()
    for P in (6, 9):  # the second call reuses both compiled graphs
        ids = torch.randint(0, 61, (2, P))
        assert torch.equal(m.generate(ids, 10, compile=True), m.generate(ids, 10))
        assert counters["stats"]["unique_graphs"] == 2
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :4] = 0
    ids = torch.randint(0, 61, (2, 9))
    out = m.generate(ids, 10, attention_mask=mask, compile=True)
    assert torch.equal(out, m.generate(ids, 10, attention_mask=mask))
