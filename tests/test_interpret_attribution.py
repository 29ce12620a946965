"""Direct logit attribution: the components sum to the model's logit (difference) once the final
norm's scale is frozen; each head's share equals an fp64 recomputation from its hook_z and its
slice of the output projection (not from hook_result), for LayerNorm and RMSNorm models with
learned, RoPE and ALiBi positions."""

import pytest
import torch

from multihead import CausalLM, LMConfig
from multihead.interpret import direct_logit_attribution, run_with_cache

B, T, V, H, D, L = 2, 5, 43, 4, 6, 3


def lm(position="learned", norm="layernorm"):
    cfg = LMConfig(
        vocab_size=V,
        dim=H * D,
        num_layers=L,
        num_heads=H,
        ffn_dim=28,
        position=position,
        norm=norm,
        tie_embeddings=False,
    )
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norm weights and biases
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize(
    "position, norm", [("learned", "layernorm"), ("rope", "rmsnorm"), ("alibi", "layernorm")]
)
def test_components_sum_to_the_logit_difference(position, norm):
    model = lm(position, norm)
    ids = torch.randint(0, V, (B, T))
    targets, against = torch.randint(0, V, (B, T)), torch.randint(0, V, (B,))
    dla = direct_logit_attribution(model, ids, targets, against=against)
    with torch.no_grad():
        logits = model(ids)
    wrong = against[:, None, None].expand(B, T, 1)
    expected = logits.gather(-1, targets[..., None])[..., 0] - logits.gather(-1, wrong)[..., 0]
    assert dla.heads.shape == (L, H, B, T) and dla.mlp.shape == dla.attn_bias.shape == (L, B, T)
    assert (dla.pos_embed is not None) == (position == "learned")
    torch.testing.assert_close(dla.logit, expected)
    torch.testing.assert_close(dla.total(), expected, atol=1e-4, rtol=1e-4)
    if norm == "rmsnorm":
        assert (dla.norm_bias == 0).all()


def test_each_head_equals_an_fp64_recomputation():
    model = lm()
    ids = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B,))
    dla = direct_logit_attribution(model, ids, targets)
    with torch.no_grad():
        _, cache = run_with_cache(model, ids)
    final = cache["resid_post", L - 1].double()
    centred = final - final.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + model.norm_f.eps).sqrt()  # (B, T, 1)
    w_u = model.head.weight.double()[targets][:, None] * model.norm_f.weight.double()  # (B, 1, C)
    for layer in range(L):
        w_o = model.layers[layer].attn.out_proj.weight.double()  # (C, H * D)
        for head in range(H):
            z = cache["z", layer][:, :, head].double()  # (B, T, D)
            result = z @ w_o[:, head * D : (head + 1) * D].T  # (B, T, C)
            result = result - result.mean(-1, keepdim=True)
            expected = (result / scale * w_u).sum(-1)
            torch.testing.assert_close(
                dla.heads[layer, head].double(), expected, atol=1e-5, rtol=1e-4
            )
    # the stream is the sum of the components the attribution reads
    parts = cache["embed"] + cache["pos_embed"]
    for layer in range(L):
        parts = parts + cache["attn_out", layer] + cache["mlp_out", layer]
    torch.testing.assert_close(parts, cache["resid_post", L - 1], atol=1e-5, rtol=1e-4)


def test_table_and_errors():
    model = lm()
    ids = torch.randint(0, V, (B, T))
    dla = direct_logit_attribution(model, ids, torch.randint(0, V, (B,)))
    text = dla.table(top=5)
    assert text.startswith("logit ") and len(text.splitlines()) == 3 + 5
    with pytest.raises(ValueError, match=r"targets must be \(B,\) or \(B, T\) = \(2, 5\)"):
        direct_logit_attribution(model, ids, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="token ids"):
        direct_logit_attribution(model, ids, torch.zeros(B))
    with pytest.raises(TypeError, match="CausalLM"):
        direct_logit_attribution(torch.nn.Linear(2, 2), ids, torch.zeros(B, dtype=torch.long))
    dropout = CausalLM(LMConfig(vocab_size=V, dim=20, num_layers=1, num_heads=4, dropout=0.1))
    with pytest.raises(ValueError, match="eval mode"):
        direct_logit_attribution(dropout, ids, torch.zeros(B, dtype=torch.long))
