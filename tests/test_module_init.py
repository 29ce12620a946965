"""Default initialisation (GPT-2 style), attention-only blocks, and pickling every activation."""

import io
import math

import pytest
import torch
import torch.nn.functional as F

from multihead.modules import (
    CausalLM,
    Decoder,
    Encoder,
    EncoderDecoder,
    LMConfig,
    StackConfig,
    TransformerBlock,
)
from multihead.modules.feedforward import ACTIVATIONS
from multihead.modules.init import init_weights, residual_projections


def first_loss(model, vocab: int) -> float:
    ids = torch.randint(0, vocab, (8, 24))
    with torch.no_grad():
        logits = model(ids)
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()))


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("attention_only", [False, True])
@pytest.mark.parametrize("tie", [True, False])
def test_first_loss_is_about_ln_vocab(position, attention_only, tie):
    V = 97
    cfg = LMConfig(
        vocab_size=V,
        dim=48,
        num_layers=3,
        num_heads=4,
        position=position,
        max_positions=32,
        attention_only=attention_only,
        tie_embeddings=tie,
    )
    loss = first_loss(CausalLM(cfg), V)
    assert abs(loss - math.log(V)) < 0.05, loss
    if tie:  # torch's own N(0, 1) embedding as the output head is far off: why the scheme exists
        assert first_loss(CausalLM(cfg, init=False), V) > math.log(V) + 1


def test_encoder_decoder_first_loss_is_about_ln_vocab():
    V = 61
    cfg = StackConfig(dim=40, num_layers=2, num_heads=5, ffn_dim=80)
    m = EncoderDecoder(V, cfg, cfg).eval()
    src, tgt, target = (torch.randint(0, V, (6, n)) for n in (9, 7, 7))
    with torch.no_grad():
        loss = F.cross_entropy(m(src, tgt).flatten(0, 1), target.flatten())
    assert abs(float(loss) - math.log(V)) < 0.05


def test_weights_follow_the_scheme():
    torch.manual_seed(0)
    L, C = 6, 256
    m = CausalLM(LMConfig(vocab_size=1000, dim=C, num_layers=L, num_heads=8, max_positions=64))
    std = lambda t: float(t.detach().std())  # noqa: E731
    assert std(m.tok.weight) == pytest.approx(0.02, rel=0.02)
    assert std(m.pos.weight) == pytest.approx(0.02, rel=0.05)
    block = m.layers[0]
    assert std(block.attn.in_proj.weight) == pytest.approx(0.02, rel=0.02)
    assert std(block.ffn.fc1.weight) == pytest.approx(0.02, rel=0.02)
    # residual projections: 0.02 / sqrt(2 x layers) (two branches per block)
    for p in residual_projections(block):
        assert std(p.weight) == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.03)
    assert not block.attn.in_proj.bias.any() and not block.ffn.fc2.bias.any()
    assert torch.equal(block.norm1.weight, torch.ones(C)) and not block.norm1.bias.any()
    assert m.head.weight is m.tok.weight


def test_branch_count_sets_the_residual_scale():
    """A decoder block adds three branches (self, cross, MLP); an attention-only block one."""
    cfg = StackConfig(dim=64, num_layers=4, num_heads=4, ffn_dim=4096)
    dec = Decoder(cfg)
    (proj,) = [p for p in residual_projections(dec.layers[0]) if p.in_features == 4096]
    assert float(proj.weight.detach().std()) == pytest.approx(0.02 / math.sqrt(3 * 4), rel=0.03)
    lm = CausalLM(
        LMConfig(vocab_size=50, dim=512, num_layers=2, num_heads=8, attention_only=True),
        init=False,
    )
    init_weights(lm, std=0.05)
    (out,) = residual_projections(lm.layers[0])
    assert float(out.weight.detach().std()) == pytest.approx(0.05 / math.sqrt(2), rel=0.03)


def test_stacks_take_init_false_and_init_is_separate():
    cfg = StackConfig(dim=32, num_layers=1, num_heads=4, ffn_dim=64)
    raw = Encoder(cfg, init=False)
    # torch's default LayerNorm is already ones; its default Linear init is uniform, not 0.02
    assert float(raw.layers[0].attn.in_proj.weight.detach().std()) > 0.05
    assert init_weights(raw) is raw
    assert float(raw.layers[0].attn.in_proj.weight.detach().std()) == pytest.approx(0.02, rel=0.1)
    with pytest.raises(ValueError, match="std must be a positive number"):
        init_weights(raw, std=0)


def test_checkpoint_loader_initialises_nothing_real(monkeypatch, tmp_path):
    """The loader builds on the meta device: init_weights touches no memory there."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=16, vocab_size=50)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    import multihead.modules.lm as lm
    from multihead.pretrained import load_causal_lm

    devices = []

    def record(model, **kwargs):
        devices.append({p.device.type for p in model.parameters()})
        return init_weights(model, **kwargs)

    monkeypatch.setattr(lm, "init_weights", record)
    model = load_causal_lm(tmp_path)
    assert devices == [{"meta"}]
    assert {p.device.type for p in model.parameters()} == {"cpu"}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_pickles(name):
    m = CausalLM(LMConfig(vocab_size=30, dim=16, num_layers=1, num_heads=2, activation=name)).eval()
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    ids = torch.randint(0, 30, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), m(ids), rtol=0, atol=0)
        torch.testing.assert_close(  # the in-place (inference) twin survives too
            loaded.layers[0].ffn.act_(torch.linspace(-3, 3, 7)),
            ACTIVATIONS[name](torch.linspace(-3, 3, 7)),
        )


def test_attention_only_block_has_no_mlp():
    torch.manual_seed(0)
    blk = TransformerBlock(16, 4, 32, norm_first=True, mlp="none").double()
    assert blk.ffn is None and blk.norm2 is None
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(blk(x), x + blk.attn(blk.norm1(x)))
    post = TransformerBlock(16, 4, 32, mlp="none").double()
    torch.testing.assert_close(post(x), post.norm1(x + post.attn(x)))
    lm = CausalLM(LMConfig(vocab_size=20, dim=16, num_layers=2, num_heads=4, attention_only=True))
    assert all(b.ffn is None for b in lm.layers)
    assert not any("ffn" in k or "norm2" in k for k in lm.state_dict())
    with pytest.raises(ValueError, match="'gelu', 'swiglu', 'gated', 'geglu' or 'none'"):
        TransformerBlock(16, 4, 32, mlp="mlp")


def test_attention_only_hook_points():
    from multihead.hooked.hooks import hook_names, run_with_cache

    lm = CausalLM(LMConfig(vocab_size=20, dim=16, num_layers=2, num_heads=4, attention_only=True))
    names = hook_names(lm)
    assert "blocks.0.hook_mlp_out" not in names and "blocks.1.hook_resid_post" in names
    ids = torch.randint(0, 20, (2, 7))
    logits, cache = run_with_cache(lm, ids)
    torch.testing.assert_close(logits, lm(ids))
    for i in range(2):  # the stream passes on unchanged: no MLP branch
        assert torch.equal(
            cache[f"blocks.{i}.hook_resid_post"], cache[f"blocks.{i}.hook_resid_mid"]
        )
    assert torch.equal(cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_resid_post"])
