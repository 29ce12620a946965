"""On CUDA: compiled generation runs its decode step as a CUDA graph (no skip) and gives the
tokens eager generation gives; autocast bf16/fp16 works. Skipped without a CUDA device."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from multihead import CausalLM, LMConfig


def lm(device):
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=12, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, position="rope"
    )
    m = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(std=0.3)
    return m.to(device)


@pytest.mark.gpu
def test_cuda_graph_generation_equals_eager():
    m = lm("cuda")
    torch._dynamo.reset()
    counters.clear()
    for P in (6, 9):
        ids = torch.randint(0, 12, (3, P), device="cuda")
        mask = torch.ones(3, P, dtype=torch.long, device="cuda")
        mask[1, :2] = 0
        for kwargs in ({}, {"attention_mask": mask}):
            assert torch.equal(
                m.generate(ids, 20, compile=True, **kwargs), m.generate(ids, 20, **kwargs)
            )
    assert counters["inductor"]["cudagraph_skips"] == 0  # the decode step ran as a CUDA graph
    assert counters["stats"]["unique_graphs"] == 3  # prefill (unpadded, padded) and the step


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_autocast_generation(dtype):
    m = lm("cuda")
    ids = torch.randint(0, 12, (2, 5), device="cuda")
    full = m.generate(ids, 8)
    with torch.autocast("cuda", dtype=dtype):
        eager = m.generate(ids, 8)
        compiled = m.generate(ids, 8, compile=True)
        logits = m(ids)
    assert logits.dtype == dtype
    torch.testing.assert_close(logits.float(), m(ids), atol=3e-2, rtol=3e-2)
    # half precision may flip a close choice, and then the rest of that row
    assert (eager == compiled).float().mean() > 0.9
    assert (eager == full).float().mean() > 0.9
