"""The induction-head study, end to end, on a CausalLM whose weights are set by hand to hold an
exact induction circuit, so every readout has a known answer.

Inputs are BOS followed by a random permutation of distinct tokens, twice. The residual stream
(C = 3V + P) has four subspaces: the token (one-hot, V), the position
(one-hot, P), the previous token (V, written by layer 0) and the prediction (V, written by
layer 1, the only one the output head reads). RMSNorm only rescales (every stream vector has the
same norm), and the MLPs write nothing.
- L0 H0, a previous-token head: query position i meets key position j when j = i - 1, and copies
  the token at j into the previous-token subspace.
- L1 H0, an induction head: query token t meets the key whose previous token is t (the token
  after t's first occurrence) and copies that key's token into the prediction subspace.
- L0 H1 and L1 H1 have zero weights: they write nothing.
BOS gives position 0, which has no previous token, a previous token no query asks for. The second
copy is predicted almost perfectly.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from multihead import CausalLM, LMConfig
from multihead.interpret import (
    ablate,
    direct_logit_attribution,
    logit_lens,
    patch,
    run_with_cache,
    run_with_hooks,
    zero_ablation,
)

V, N = 10, 6  # vocabulary, half length
BOS = V - 1  # never in the halves
T, P = 2 * N + 1, 2 * N + 2  # BOS, half, half; P makes C even
COPY = N + 1  # where the copy starts
TOK, POS, PREV, OUT = 0, V, V + P, 2 * V + P  # where each subspace starts
C, H = 3 * V + P, 2
D = C // H
SCORE = 12.0  # query/key norm: a score gap of 144 / sqrt(D), so patterns are one-hot
LOGIT = 16.0  # the predicted token's logit


def induction_model():
    cfg = LMConfig(
        vocab_size=V,
        dim=C,
        num_layers=2,
        num_heads=H,
        ffn_dim=8,
        max_positions=P,
        norm="rmsnorm",
        tie_embeddings=False,
    )
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.layers[0].norm1, model.layers[1].norm1, model.norm_f):
            norm.weight.fill_(1.0)
        model.tok.weight[torch.arange(V), TOK + torch.arange(V)] = 1
        model.pos.weight[torch.arange(P), POS + torch.arange(P)] = 1
        s0, s1, s2 = math.sqrt(C / 2), math.sqrt(C / 3), math.sqrt(C / 4)  # RMSNorm scales
        a0 = model.layers[0].attn
        q, k, v = a0.in_proj.weight.view(3, C, C)  # rows: q | k | v; head 0 = rows 0..D-1
        for p in range(P):
            q[p, POS + p] = SCORE / s0  # query: my position
            if p + 1 < P:
                k[p + 1, POS + p] = SCORE / s0  # key: the position after mine
        for t in range(V):
            v[t, TOK + t] = 1.0
            a0.out_proj.weight[PREV + t, t] = 1 / s0  # into the previous-token subspace
        a1 = model.layers[1].attn
        q, k, v = a1.in_proj.weight.view(3, C, C)
        for t in range(V):
            q[t, TOK + t] = SCORE / s1  # query: my token
            k[t, PREV + t] = SCORE / s1  # key: the token before the key
            v[t, TOK + t] = 1.0
            a1.out_proj.weight[OUT + t, t] = 1 / s1  # into the prediction subspace
            model.head.weight[t, OUT + t] = LOGIT / s2
    return model


@pytest.fixture(scope="module")
def study():
    torch.manual_seed(0)
    model = induction_model()
    bos = torch.full((4, 1), BOS)
    half = torch.stack([torch.randperm(V - 1)[:N] for _ in range(4)])  # distinct tokens, no BOS
    ids = torch.cat([bos, half, half], dim=1)  # (4, 13)
    other = torch.stack([torch.randperm(V - 1)[:N] for _ in range(4)])
    corrupted = torch.cat([bos, other, half], dim=1)  # the copy has nothing to copy from
    return model, ids, corrupted


def copy_loss(logits, ids):
    """Next-token loss over the copy, where an induction head can predict."""
    return F.cross_entropy(logits[:, COPY:-1].flatten(0, 1), ids[:, COPY + 1 :].flatten())


def test_patterns_show_the_circuit(study):
    model, ids, _ = study
    with torch.no_grad():
        logits, cache = run_with_cache(model, ids)
    previous_token = cache["pattern", 0].diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, 2))
    # query i of the copy -> key i - (N - 1): the token after the first occurrence of i's token
    induction = cache["pattern", 1].diagonal(offset=-(N - 1), dim1=-2, dim2=-1)[..., COPY - N + 1 :]
    assert previous_token[0] > 0.999 and previous_token[1] < 0.5
    assert induction.mean((0, 2))[0] > 0.999 and induction.mean((0, 2))[1] < 0.5
    assert float(copy_loss(logits, ids)) < 1e-3


def test_ablation_finds_the_heads_that_matter(study):
    model, ids, _ = study
    with torch.no_grad():
        clean = copy_loss(model(ids), ids)
        for layer in range(2):
            out = run_with_hooks(model, ids, fwd_hooks=zero_ablation(model, [(layer, 0)]))
            assert copy_loss(out, ids) > 1.0  # either head of the circuit is needed
            out = run_with_hooks(model, ids, fwd_hooks=zero_ablation(model, [(layer, 1)]))
            assert copy_loss(out, ids) == clean  # the idle heads write zeros anyway
        # the induction head ablated only where it predicts the second half
        positions = list(range(COPY, T))
        out = run_with_hooks(
            model, ids, fwd_hooks=zero_ablation(model, [(1, 0)], positions=positions)
        )
        assert copy_loss(out, ids) > 1.0
        with ablate(model, [(0, 0)], "mean", reference=torch.randint(0, V, (3, T))):
            assert copy_loss(model(ids), ids) > 1.0  # an average previous token says nothing


def test_patching_credits_the_induction_head(study):
    model, ids, corrupted = study
    result = patch(model, ids, corrupted, lambda logits: -copy_loss(logits, ids), resid="resid_pre")
    heads = result.heads
    assert heads[1, 0] > 0.99  # the induction head alone restores the copy
    assert heads[0, 1] == 0 and heads[1, 1] == 0  # idle heads recover exactly nothing
    # the clean previous tokens (L0 H0) alone lead layer 1 to the corrupted copy's tokens, a
    # confident wrong prediction: worse than the corrupted run
    assert heads[0, 0] < 0
    # the streams into block 0 at the first copy's positions carry the difference together,
    # each alone only a part of it; BOS and the second copy carry none
    assert (result.resid["resid_pre"][0, COPY:] == 0).all() and result.resid["resid_pre"][0, 0] == 0
    assert "L1 H0" in result.table(top=1)


def test_logit_lens_sees_the_prediction_appear_in_block_1(study):
    model, ids, _ = study
    lens = logit_lens(model, ids)
    # block 0 writes nothing the head reads: every logit is 0, the loss is exactly log V
    assert float(lens.loss[0]) == pytest.approx(math.log(V), abs=1e-5)
    assert float(lens.token_loss[1, :, COPY:].max()) < 1e-3  # block 1 predicts the copy
    assert torch.equal(lens.top_tokens[1, :, COPY:-1, 0], ids[:, COPY + 1 :])


def test_direct_logit_attribution_of_the_induction_head(study):
    model, ids, _ = study
    targets = ids.roll(-1, dims=1)  # the next token
    dla = direct_logit_attribution(model, ids, targets)
    copy = slice(COPY, T - 1)
    torch.testing.assert_close(
        dla.heads[1, 0, :, copy], torch.full((4, N - 1), LOGIT), atol=1e-3, rtol=0
    )
    others = dla.heads[:, :, :, copy].clone()
    others[1, 0] = 0
    assert others.abs().max() < 1e-4 and dla.mlp.abs().max() == 0
    torch.testing.assert_close(dla.total(), dla.logit, atol=1e-4, rtol=0)
