"""The demo's ablation table against an independent implementation: a torch pre-hook on the
output projection that rewrites one head's slice of its input (zeros, or that slice's mean
recorded over the held-out set)."""

import pytest
import torch
from torch import nn

from multihead import CausalLM, LMConfig
from multihead.train.ablation import ablate_heads, repeated_copy_loss
from multihead.train.data import RepeatTask
from multihead.train.probe import HeldOut

L, H, C = 2, 3, 24
D = C // H


def rewrite_head(proj: nn.Linear, head: int, value: torch.Tensor | None, seen: list):
    """A torch forward pre-hook on out_proj (not multihead's hook points): records its input
    (B, T, H*D) and, given a value, overwrites head `head`'s slice with it."""

    def hook(module, args):
        (z,) = args
        seen.append(z.detach().clone())
        if value is None:
            return None
        z = z.clone()
        z[..., head * D : (head + 1) * D] = value
        return (z,)

    return proj.register_forward_pre_hook(hook)


def model_and_data():
    torch.manual_seed(0)
    m = CausalLM(LMConfig(vocab_size=17, dim=C, num_layers=L, num_heads=H, position="alibi"))
    for p in m.parameters():  # larger weights: heads that matter, patterns that are not uniform
        nn.init.normal_(p, std=0.3)
    task = RepeatTask(vocab_size=17, context=20, segment=(3, 6), gap=(0, 2))
    return m.eval(), HeldOut.make(task, layouts=3, per_layout=5, seed=1)


def loss_with(m, held_out, layer, head, value):
    handle = rewrite_head(m.attention(layer).out_proj, head, value, [])
    try:
        return repeated_copy_loss(m, held_out)
    finally:
        handle.remove()


def head_mean(m, held_out, layer, head):
    seen: list = []
    handle = rewrite_head(m.attention(layer).out_proj, head, None, seen)
    try:
        with torch.no_grad():
            m(held_out.batch.ids)
    finally:
        handle.remove()
    z = seen[0].flatten(0, 1)  # (N, H*D): every held-out position
    return z[:, head * D : (head + 1) * D].mean(0)


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread (a second one's spin-waits are slow on a loaded machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_ablation_table_matches_rewriting_the_projection_input(one_thread):
    m, held_out = model_and_data()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    base = repeated_copy_loss(m, held_out)
    table = ablate_heads(m, held_out)
    assert [(a.layer, a.head) for a in table] == [(i, h) for i in range(L) for h in range(H)]
    for a in table:
        zero = loss_with(m, held_out, a.layer, a.head, torch.zeros(D))
        mean = loss_with(m, held_out, a.layer, a.head, head_mean(m, held_out, a.layer, a.head))
        assert abs(a.zero - zero) < 1e-5 and abs(a.mean - mean) < 1e-5
    assert any(abs(a.zero - base) > 0.01 for a in table)  # the heads matter
    assert any(abs(a.zero - a.mean) > 0.01 for a in table)  # and the two ablations differ
    # the model is left as it was
    assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
    assert repeated_copy_loss(m, held_out) == base
    assert not m.training
