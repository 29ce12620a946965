"""Zero and mean ablation of one head, against an independent implementation: a wrapper around
the output projection that rewrites the head's slice of its input."""

import torch
from torch import nn

from multihead.interpret import head_gates
from multihead.modules import CausalLM, LMConfig
from multihead.train.ablation import (
    ablate_heads,
    head_means,
    mean_ablated,
    repeated_copy_loss,
    zero_ablated,
)
from multihead.train.data import RepeatTask
from multihead.train.probe import HeldOut

L, H, C = 2, 3, 24
D = C // H


class RewriteHead(nn.Module):
    """Stands in for out_proj: records its input (B, T, H*D) and can overwrite head h's slice."""

    def __init__(self, proj: nn.Linear, head: int, value: torch.Tensor | None = None):
        super().__init__()
        self.proj, self.head, self.value = proj, head, value
        self.inputs: list[torch.Tensor] = []

    def forward(self, z):
        self.inputs.append(z.detach().clone())
        if self.value is not None:
            z = z.clone()
            z[..., self.head * D : (self.head + 1) * D] = self.value
        return self.proj(z)


def model_and_data():
    torch.manual_seed(0)
    m = CausalLM(
        LMConfig(vocab_size=17, dim=C, num_layers=L, num_heads=H, position="alibi"),
    ).eval()
    for p in m.parameters():  # larger weights: heads that matter, patterns that are not uniform
        nn.init.normal_(p, std=0.3)
    task = RepeatTask(vocab_size=17, context=20, segment=(3, 6), gap=(0, 2))
    return m, HeldOut.make(task, layouts=3, per_layout=5, seed=1)


def test_zero_ablation_is_a_zero_gate():
    m, held_out = model_and_data()
    ids = held_out.batch.ids
    gates = torch.ones(L, H)
    gates[1, 2] = 0
    with torch.no_grad(), head_gates(m, gates):
        expected = m(ids)
    with torch.no_grad(), zero_ablated(m, 1, 2):
        torch.testing.assert_close(m(ids), expected, rtol=0, atol=0)
    with torch.no_grad():
        attn = m.attention(1)
        attn.out_proj = RewriteHead(attn.out_proj, 2, torch.zeros(D))
        torch.testing.assert_close(m(ids), expected)


def test_head_means_and_mean_ablation_match_rewriting_the_projection_input():
    m, held_out = model_and_data()
    layer, head = 0, 1
    means = head_means(m, held_out)
    assert means.shape == (L, H, D)
    # independent: record the projection's input over the held-out set
    attn = m.attention(layer)
    proj = attn.out_proj
    recorder = RewriteHead(proj, head)
    attn.out_proj = recorder
    with torch.no_grad():
        for rows, _ in held_out.groups():  # one layout at a time: the mean is over all rows
            m(held_out.batch.ids[rows])
    z = torch.cat([x.flatten(0, 1) for x in recorder.inputs])  # (N, H*D)
    torch.testing.assert_close(means[layer], z.mean(0).view(H, D), atol=1e-6, rtol=1e-5)
    ids = held_out.batch.ids[5:10]
    with torch.no_grad():
        attn.out_proj = RewriteHead(proj, head, means[layer, head])
        expected = m(ids)
        attn.out_proj = proj
        bias = proj.bias.detach().clone()
        with mean_ablated(m, layer, head, means):
            actual = m(ids)
        assert torch.equal(proj.bias, bias)  # restored bit for bit
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(actual, m(ids), atol=1e-3)  # the head mattered


def test_ablate_heads_covers_every_head_and_restores_the_model():
    m, held_out = model_and_data()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    base = repeated_copy_loss(m, held_out)
    table = ablate_heads(m, held_out)
    assert [(a.layer, a.head) for a in table] == [(i, h) for i in range(L) for h in range(H)]
    with zero_ablated(m, 1, 0):
        assert table[H].zero == repeated_copy_loss(m, held_out)
    assert all(a.zero != base and a.mean != base for a in table)
    assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
    assert repeated_copy_loss(m, held_out) == base
