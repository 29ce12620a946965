"""Hook points against Hugging Face: random GPT-2 and BERT models saved by `transformers` (several
sizes), loaded by multihead; every cached activation equals the tensor HF computes at the same
place (hidden_states, output_attentions with eager attention, module outputs seen through torch
forward hooks), and the model's output is bit-identical while the cache records."""

import pytest
import torch

from helpers_bert import save_bert
from multihead.interpret import capture, run_with_cache, run_with_hooks
from multihead.pretrained import BertEncoder, load_causal_lm, load_encoder

transformers = pytest.importorskip("transformers")

CLOSE = dict(atol=1e-5, rtol=1e-4)
# (n_embd, n_layer, n_head): head counts and widths distinct from each other and from B, T.
GPT2_SIZES = [(48, 3, 4), (30, 2, 5), (36, 4, 3)]
BERT_SIZES = [(24, 2, 3, 40), (40, 3, 5, 28), (36, 1, 6, 20)]


def save_gpt2(path, n_embd, n_layer, n_head, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=70,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=1,
        attn_implementation="eager",
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(path)
    return hf


class Recorder:
    """Inputs and outputs of HF submodules, through torch forward hooks."""

    def __init__(self, modules):
        self.inputs, self.outputs = {}, {}
        self.handles = [
            m.register_forward_hook(self._hook(name), with_kwargs=True)
            for name, m in modules.items()
        ]

    def _hook(self, name):
        def hook(module, args, kwargs, output):
            self.inputs[name] = args[0] if args else next(iter(kwargs.values()))
            self.outputs[name] = output[0] if isinstance(output, tuple) else output

        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def heads_last(x, n_head):
    """(B, T, H * D) -> (B, T, H, D), how our hooks show per-head tensors."""
    return x.view(*x.shape[:2], n_head, -1)


@pytest.mark.parametrize("size", GPT2_SIZES)
def test_gpt2_activations_equal_transformers(tmp_path, size):
    n_embd, n_layer, n_head = size
    hf = save_gpt2(tmp_path, *size)
    ours = load_causal_lm(tmp_path).eval()
    ids = torch.randint(0, 70, (2, 9))
    t = hf.transformer
    watched = {"wte": t.wte, "wpe": t.wpe, "ln_f": t.ln_f}
    for i, block in enumerate(t.h):
        watched |= {
            f"{i}.c_attn": block.attn.c_attn,
            f"{i}.c_proj": block.attn.c_proj,
            f"{i}.ln_2": block.ln_2,
            f"{i}.mlp": block.mlp,
        }
    rec = Recorder(watched)
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True, output_attentions=True)
        plain = ours(ids)
        logits, cache = run_with_cache(ours, ids, names=lambda n: True)
    rec.close()
    assert torch.equal(logits, plain)  # recording changes nothing, bit for bit
    torch.testing.assert_close(logits, ref.logits, **CLOSE)
    torch.testing.assert_close(cache["hook_embed"], rec.outputs["wte"], **CLOSE)
    pos = rec.outputs["wpe"].expand(2, 9, n_embd)
    torch.testing.assert_close(cache["hook_pos_embed"], pos, **CLOSE)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], ref.hidden_states[0], **CLOSE)
    for i in range(n_layer):
        # HF's last hidden state is after ln_f; the others are the blocks' outputs.
        expected = ref.hidden_states[i + 1] if i + 1 < n_layer else rec.inputs["ln_f"]
        torch.testing.assert_close(cache["resid_post", i], expected, **CLOSE)
        torch.testing.assert_close(cache["pattern", i], ref.attentions[i], **CLOSE)
        q, k, v = rec.outputs[f"{i}.c_attn"].split(n_embd, dim=-1)
        for name, x in (("q", q), ("k", k), ("v", v)):
            torch.testing.assert_close(cache[name, i], heads_last(x, n_head), **CLOSE)
        torch.testing.assert_close(cache["z", i], heads_last(rec.inputs[f"{i}.c_proj"], n_head))
        torch.testing.assert_close(cache["attn_out", i], rec.outputs[f"{i}.c_proj"], **CLOSE)
        torch.testing.assert_close(cache["resid_mid", i], rec.inputs[f"{i}.ln_2"], **CLOSE)
        torch.testing.assert_close(cache["mlp_out", i], rec.outputs[f"{i}.mlp"], **CLOSE)
        # The scores: masked, before softmax; softmax of them is the pattern.
        scores = cache["attn_scores", i]
        assert scores.shape == (2, n_head, 9, 9)
        assert torch.isneginf(scores.triu(1)[..., 0, 1:]).all()
        torch.testing.assert_close(scores.softmax(-1), cache["pattern", i], **CLOSE)
        result = cache[f"blocks.{i}.attn.hook_result"]
        assert result.shape == (2, 9, n_head, n_embd)
    torch.testing.assert_close(cache["ln_final.hook_normalized"], ref.hidden_states[-1], **CLOSE)
    torch.testing.assert_close(cache["ln_final.hook_normalized"], rec.outputs["ln_f"], **CLOSE)


def test_gpt2_logits_bit_identical_under_read_only_hooks_and_capture(tmp_path):
    save_gpt2(tmp_path, 48, 3, 4)
    ours = load_causal_lm(tmp_path).eval()
    ids = torch.randint(0, 70, (3, 11))
    seen = []
    with torch.no_grad():
        plain = ours(ids)
        with capture(ours) as records:
            captured = ours(ids)
        _, cache = run_with_cache(ours, ids, names=lambda n: True)
        # run_with_hooks readers on points that do not route the call elsewhere
        read = run_with_hooks(
            ours,
            ids,
            fwd_hooks=[
                (
                    lambda n: not n.endswith(("pattern", "scores", "result")),
                    lambda a, n: seen.append(n),
                )
            ],
        )
    assert torch.equal(captured, plain) and torch.equal(read, plain)
    assert len(records) == 3 and len(seen) == len(cache) - 3 * 3  # minus scores, pattern, result
    for i, r in enumerate(records):
        torch.testing.assert_close(r.weights, cache["pattern", i])


@pytest.mark.parametrize("size", BERT_SIZES)
def test_bert_activations_equal_transformers(tmp_path, size):
    hidden, layers, heads, ffn = size
    hf = save_bert(
        tmp_path,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        attn_implementation="eager",
    )
    enc = load_encoder(tmp_path)
    ids = torch.randint(5, 40, (3, 8))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, 5:] = 0
    types = torch.randint(0, 2, (3, 8))
    e = hf.embeddings
    rec = Recorder(
        {
            "word": e.word_embeddings,
            "pos": e.position_embeddings,
            "type": e.token_type_embeddings,
        }
    )
    with torch.no_grad():
        ref = hf(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=types,
            output_hidden_states=True,
            output_attentions=True,
        )
        plain = enc(ids, mask, types).last_hidden_state
        out, cache = run_with_cache(enc, ids, mask, types)
    rec.close()
    assert torch.equal(out.last_hidden_state, plain)
    assert "ln_final.hook_normalized" not in cache  # post-norm BERT has no final norm
    torch.testing.assert_close(cache["hook_embed"], rec.outputs["word"], **CLOSE)
    torch.testing.assert_close(cache["hook_pos_embed"], rec.outputs["pos"].expand(3, 8, hidden))
    torch.testing.assert_close(cache["hook_token_type_embed"], rec.outputs["type"], **CLOSE)
    torch.testing.assert_close(cache["resid_pre", 0], ref.hidden_states[0], **CLOSE)
    for i in range(layers):
        torch.testing.assert_close(cache["resid_post", i], ref.hidden_states[i + 1], **CLOSE)
        torch.testing.assert_close(cache["pattern", i], ref.attentions[i], **CLOSE)
        assert (cache["pattern", i][1, :, :, 5:] == 0).all()  # padding keys get nothing
        assert cache["q", i].shape == (3, 8, heads, hidden // heads)


def test_bert_encoder_module_and_packed_input(tmp_path):
    """The bare BertEncoder has the same names; packed input shows (1, N, H, D) activations that
    equal the padded run's real tokens, and refuses pattern hooks with a clear error."""
    save_bert(tmp_path, hidden_size=40, num_hidden_layers=2, num_attention_heads=5)
    enc = load_encoder(tmp_path)
    model: BertEncoder = enc.model
    lengths = [6, 3, 4]
    ids = [torch.randint(5, 40, (n,)) for n in lengths]
    flat = torch.cat(ids)
    padded = torch.zeros(3, 6, dtype=torch.long)
    mask = torch.zeros(3, 6, dtype=torch.long)
    for row, x in enumerate(ids):
        padded[row, : len(x)] = x
        mask[row, : len(x)] = 1
    real = mask.bool()
    with torch.no_grad():
        _, packed_cache = run_with_cache(
            model, flat, lengths=lengths, names=lambda n: "pattern" not in n and "scores" not in n
        )
        _, padded_cache = run_with_cache(model, padded, mask)
    assert packed_cache["z", 1].shape == (1, 13, 5, 8)
    assert packed_cache["result", 1].shape == (1, 13, 5, 40)
    for name in ("q", "k", "v", "z"):
        for layer in range(2):
            torch.testing.assert_close(
                packed_cache[name, layer][0], padded_cache[name, layer][real], **CLOSE
            )
    torch.testing.assert_close(packed_cache["resid_post", 1], padded_cache["resid_post", 1][real])
    for point in ("pattern", "attn_scores"):
        with pytest.raises(ValueError, match="packed sequences"):
            run_with_cache(model, flat, lengths=lengths, names=f"blocks.0.attn.hook_{point}")
    with pytest.raises(ValueError, match="packed sequences"), capture(model):
        model(flat, lengths=lengths)
