"""The real SmolLM2-135M-Instruct Q4_1 GGUF: multihead's load against transformers' own GGUF
loading of the same file (weights, logits, greedy text, tokenizer ids), and its induction
heads. transformers' load dequantises with gguf's numpy code and takes ~40-130 s on this 2-core
machine, so it happens once per session (the `reference` fixture)."""

from __future__ import annotations

import pytest
import torch

from multihead.interpret import run_with_cache

TEXTS = [
    "Hello world",
    "  two  spaces,\ttab and\nnewlines\n\n",
    "Ünïcödé ☃ 日本語 emoji 🙂 façade",
    "def f(x):\n    return x + 1  # code",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]


@pytest.fixture(scope="module")
def reference(smollm2_gguf_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = smollm2_gguf_path.parent, smollm2_gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=name)


def test_shape_and_metadata(smollm2):
    config = smollm2.config
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (30, 9, 3)
    assert (config.dim, config.vocab_size, config.max_positions) == (576, 49152, 8192)
    assert config.rope_theta == 100000.0 and config.tie_embeddings


def test_weights_equal_transformers_dequantisation(smollm2, reference):
    theirs = reference[0].state_dict()
    # (the default load keeps the matrices packed: `.weight` is their dequantised view)
    assert torch.equal(smollm2.tok.weight, theirs["model.embed_tokens.weight"])  # Q8_0
    for i in (0, 17, 29):
        layer = smollm2.layers[i]
        q, k, v = layer.attn.in_proj.weight.split([576, 192, 192])
        attn = f"model.layers.{i}.self_attn"
        assert torch.equal(q, theirs[f"{attn}.q_proj.weight"])  # Q4_1, rotary rows unpermuted
        assert torch.equal(k, theirs[f"{attn}.k_proj.weight"])
        assert torch.equal(v, theirs[f"{attn}.v_proj.weight"])
        assert torch.equal(layer.ffn.down.weight, theirs[f"model.layers.{i}.mlp.down_proj.weight"])


def test_logits_equal_transformers(smollm2, reference):
    ids = torch.randint(0, 49152, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference[0](ids).logits
        got = smollm2(ids)
    # same weights; 30 layers of float32 rounding in different kernel orders
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


def test_greedy_generation_identical(smollm2, reference):
    model, tokenizer = reference
    prompt = tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=10, do_sample=False)
    got = smollm2.generate(prompt, 10)
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(smollm2, reference, text):
    theirs = reference[1](text, add_special_tokens=False)["input_ids"]
    ours = smollm2.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    assert ours == theirs
    assert smollm2.tokenizer.tokenizer.decode(ours, skip_special_tokens=False) == text


def test_tokenizer_special_ids(smollm2):
    tok = smollm2.tokenizer
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos) == (1, 2, 2, False)


def test_induction_heads_on_repeated_random_tokens(smollm2):
    # <|im_start|> R R, R = 20 random tokens (past the 17 special ones): an induction head at
    # position i of the second copy attends to i - 20 + 1, the token after the earlier copy
    n = 20
    g = torch.Generator().manual_seed(0)
    half = torch.randint(17, 49152, (4, n), generator=g)
    ids = torch.cat([torch.ones(4, 1, dtype=torch.long), half, half], dim=1)  # (4, 41)
    with torch.no_grad():
        _, cache = run_with_cache(smollm2, ids, names=lambda name: name.endswith("hook_pattern"))
    scores = torch.stack(
        [
            cache["pattern", layer]
            .diagonal(offset=-(n - 1), dim1=-2, dim2=-1)[..., 1:]
            .mean((0, 2))
            for layer in range(30)
        ]
    )  # (layers, heads): mean attention to the token after the earlier copy
    top = {(int(i) // 9, int(i) % 9) for i in scores.flatten().topk(6).indices}
    assert {(18, 6), (17, 3), (17, 4), (17, 5)} <= top, sorted(top)
    assert scores[18, 6] > 0.5
