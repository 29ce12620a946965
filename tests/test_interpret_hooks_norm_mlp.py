"""Norm, MLP and logits hook points against Hugging Face: random GPT-2 and Llama checkpoints
saved by `transformers`, loaded by multihead; each cached activation equals the tensor HF computes
at the same place (torch forward hooks on HF's modules: ln_1, mlp.act, act_fn, gate/up/down),
and replacing a norm's scale divides by the replacement (freezing a norm)."""

import pytest
import torch

from helpers_llama import save_causal
from multihead.interpret import run_with_cache, run_with_hooks
from multihead.pretrained import load_causal_lm

transformers = pytest.importorskip("transformers")

CLOSE = dict(atol=1e-5, rtol=1e-4)
B, T = 2, 7


class Recorder:
    """Inputs and outputs of HF submodules, through torch forward hooks."""

    def __init__(self, modules):
        self.inputs, self.outputs = {}, {}
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in modules.items()]

    def _hook(self, name):
        def hook(module, args, output):
            self.inputs[name], self.outputs[name] = args[0], output

        return hook

    def close(self):
        for h in self.handles:
            h.remove()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=61, n_embd=30, n_layer=2, n_head=5, n_positions=32, attn_implementation="eager"
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # LayerNorm weights and biases random (init: ones / zeros)
        for name, p in hf.named_parameters():
            if "ln" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
    hf.save_pretrained(path)
    return hf, load_causal_lm(path).eval()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    hf = save_causal(path, "llama")  # GQA: 4 query heads, 2 kv heads; random norms
    return hf, load_causal_lm(path).eval()


def test_gpt2_norm_mlp_and_logits_hooks_equal_transformers(gpt2):
    hf, ours = gpt2
    ids = torch.randint(0, 61, (B, T))
    watched = {"ln_f": hf.transformer.ln_f}
    for i, block in enumerate(hf.transformer.h):
        watched |= {
            f"{i}.ln_1": block.ln_1,
            f"{i}.ln_2": block.ln_2,
            f"{i}.c_fc": block.mlp.c_fc,
            f"{i}.act": block.mlp.act,
        }
    rec = Recorder(watched)
    with torch.no_grad():
        ref = hf(ids).logits
        plain = ours(ids)
        logits, cache = run_with_cache(ours, ids)
    rec.close()
    assert torch.equal(logits, plain)
    torch.testing.assert_close(cache["hook_logits"], ref, **CLOSE)
    torch.testing.assert_close(cache["logits"], logits, atol=0, rtol=0)
    for i in range(2):
        for ln, hf_ln in (("ln1", "ln_1"), ("ln2", "ln_2")):
            x = rec.inputs[f"{i}.{hf_ln}"]
            normalized = cache["normalized", i, ln]
            torch.testing.assert_close(normalized, rec.outputs[f"{i}.{hf_ln}"], **CLOSE)
            # hook_scale: the divisor of the centred input, (B, T, 1)
            scale = cache["scale", i, ln]
            assert scale.shape == (B, T, 1)
            centred = x - x.mean(-1, keepdim=True)
            torch.testing.assert_close(scale, (x.var(-1, unbiased=False) + 1e-5).sqrt()[..., None])
            module = getattr(hf.transformer.h[i], hf_ln)
            by_hand = centred / scale * module.weight + module.bias
            torch.testing.assert_close(by_hand, rec.outputs[f"{i}.{hf_ln}"], **CLOSE)
        torch.testing.assert_close(cache["pre", i], rec.outputs[f"{i}.c_fc"], **CLOSE)
        torch.testing.assert_close(
            cache[f"blocks.{i}.mlp.hook_post"], rec.outputs[f"{i}.act"], **CLOSE
        )
    torch.testing.assert_close(cache["ln_final.hook_normalized"], rec.outputs["ln_f"], **CLOSE)
    assert cache["scale"].shape == (B, T, 1)


def test_llama_gated_mlp_and_rmsnorm_hooks_equal_transformers(llama):
    hf, ours = llama
    ids = torch.randint(0, 96, (B, T))
    watched = {"norm": hf.model.norm}
    for i, layer in enumerate(hf.model.layers):
        mlp = layer.mlp
        watched |= {
            f"{i}.input_layernorm": layer.input_layernorm,
            f"{i}.post_attention_layernorm": layer.post_attention_layernorm,
            f"{i}.gate": mlp.gate_proj,
            f"{i}.up": mlp.up_proj,
            f"{i}.act_fn": mlp.act_fn,
            f"{i}.down": mlp.down_proj,
        }
    rec = Recorder(watched)
    with torch.no_grad():
        ref = hf(ids).logits
        _, cache = run_with_cache(ours, ids)
    rec.close()
    torch.testing.assert_close(cache["hook_logits"], ref, **CLOSE)
    for i in range(2):
        for ln, hf_ln in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            x = rec.inputs[f"{i}.{hf_ln}"]
            torch.testing.assert_close(cache["normalized", i, ln], rec.outputs[f"{i}.{hf_ln}"])
            rms = (x.pow(2).mean(-1, keepdim=True) + hf.config.rms_norm_eps).sqrt()
            torch.testing.assert_close(cache["scale", i, ln], rms, **CLOSE)
        torch.testing.assert_close(cache["pre", i], rec.outputs[f"{i}.gate"], **CLOSE)
        torch.testing.assert_close(cache["pre_linear", i], rec.outputs[f"{i}.up"], **CLOSE)
        # hook_post is what down_proj reads: act_fn(gate) * up
        torch.testing.assert_close(cache["post", i], rec.inputs[f"{i}.down"], **CLOSE)
        product = rec.outputs[f"{i}.act_fn"] * rec.outputs[f"{i}.up"]
        torch.testing.assert_close(cache["post", i], product, **CLOSE)
    torch.testing.assert_close(cache["ln_final.hook_normalized"], rec.outputs["norm"], **CLOSE)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_replacing_a_norm_scale_freezes_the_norm(which, gpt2, llama):
    _, ours = gpt2 if which == "gpt2" else llama
    ids = torch.randint(0, 61, (B, T))
    other = torch.randint(0, 61, (B, T))
    name = "blocks.1.ln2.hook_scale"
    with torch.no_grad():
        plain, cache = run_with_cache(ours, ids)
        _, other_cache = run_with_cache(ours, other)
        # The model's own scale handed back: the same logits.
        same = run_with_hooks(ours, ids, fwd_hooks=[(name, lambda a, n: cache[name].clone())])
        # Another input's scale: ln2's output is the centred input divided by it, times w, + b.
        frozen_ln = {}
        run_with_hooks(
            ours,
            ids,
            fwd_hooks=[
                (name, lambda a, n: other_cache[name].clone()),
                ("blocks.1.ln2.hook_normalized", lambda a, n: frozen_ln.setdefault("x", a)),
            ],
        )
    torch.testing.assert_close(same, plain, **CLOSE)
    x = cache["blocks.1.hook_resid_mid"]
    norm = ours.blocks[1].ln2
    if which == "gpt2":
        x = x - x.mean(-1, keepdim=True)
    expected = x / other_cache[name] * norm.weight
    if norm.bias is not None:
        expected = expected + norm.bias
    torch.testing.assert_close(frozen_ln["x"], expected, **CLOSE)
    assert not torch.allclose(frozen_ln["x"], cache["blocks.1.ln2.hook_normalized"], atol=1e-3)


def test_module_aliases_keep_state_dict_keys(gpt2):
    _, ours = gpt2
    assert ours.blocks is ours.layers and ours.ln_final is ours.norm_f
    assert ours.blocks[0].ln1 is ours.layers[0].norm1 and ours.blocks[0].mlp is ours.layers[0].ffn
    keys = list(ours.state_dict())
    assert not any(k.startswith(("blocks.", "ln_final.")) or ".ln1." in k for k in keys)
    assert "layers.0.norm1.weight" in keys and "norm_f.bias" in keys
