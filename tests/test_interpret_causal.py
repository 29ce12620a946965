"""`analyze` and head importance on causal LMs: random GPT-2 models saved by `transformers`, with
a real byte-level BPE tokenizer.json, checked against Hugging Face's own computation."""

import json

import pytest
import torch
import torch.nn.functional as F

from helpers_gpt2 import EOT, save_gpt2, write_tokenizer
from multihead.interpret.analysis import analyze, text_attention
from multihead.interpret.importance import (
    ablation_importance,
    gradient_importance,
    layer_ablation_importance,
    pruning_curve,
)
from multihead.interpret.subject import CausalLMSubject, as_subject, load_subject

transformers = pytest.importorskip("transformers")

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."
TEXTS = [TEXT, "A cat sat on the mat.", "Stocks fell sharply today!"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    hf = save_gpt2(path, n_layer=2, n_head=3, n_embd=24, scale=3.0)
    return hf, path


def hf_attentions(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions])  # (L, H, T, T)


@pytest.mark.parametrize(
    ("n_layer", "n_head", "n_embd"), [(2, 3, 24), (3, 4, 32)], ids=["2x3", "3x4"]
)
def test_patterns_equal_transformers_eager(tmp_path, n_layer, n_head, n_embd):
    hf = save_gpt2(tmp_path, n_layer=n_layer, n_head=n_head, n_embd=n_embd, scale=3.0, seed=1)
    assert hf.config._attn_implementation == "eager"
    subject = load_subject(tmp_path)
    analysis = analyze(subject, [TEXT], probe=False)
    item = analysis.texts[0]
    ids = subject.encode(TEXT).ids
    assert ids[0] == hf.config.bos_token_id and item.tokens[0] == EOT  # GPT-2's BOS first
    expected = hf_attentions(hf, ids)
    assert item.attn.shape == (n_layer, n_head, len(ids), len(ids))
    torch.testing.assert_close(item.attn, expected, atol=1e-5, rtol=1e-4)
    upper = torch.triu(torch.ones(len(ids), len(ids), dtype=torch.bool), diagonal=1)
    assert item.attn[..., upper].abs().max() == 0  # nothing above the diagonal
    assert analysis.causal and analysis.kind == "causal LM"
    assert "next" not in analysis.metrics and "next" in analysis.undefined
    assert not any(r.role == "next-token" for row in analysis.roles for h in row for r in h)


@pytest.mark.parametrize("case", ["llama", "mistral-window"])
def test_llama_family_patterns_equal_transformers(tmp_path, case):
    """Llama-style: RoPE, grouped-query heads, a SentencePiece tokenizer.json that puts <s>
    first itself (kept as it is); Mistral's sliding window leaves a band."""
    from helpers_gpt2 import write_sentencepiece_tokenizer
    from helpers_llama import save_causal

    special = write_sentencepiece_tokenizer(tmp_path)
    save_causal(tmp_path, case, vocab_size=special["size"] + 6, bos_token_id=special["<s>"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    subject = load_subject(tmp_path)
    assert subject.kind == "causal LM" and subject.prefix == [special["<s>"]]
    analysis = analyze(subject, [TEXT], probe=False)
    item = analysis.texts[0]
    ids = subject.encode(TEXT).ids
    assert item.tokens[0] == "<s>" and "".join(item.tokens[1:]).strip() == TEXT
    torch.testing.assert_close(item.attn, hf_attentions(hf.eval(), ids), atol=1e-5, rtol=1e-4)
    assert analysis.sink_label == "<s>" and "next" in analysis.undefined
    if case == "mistral-window":  # query 10 sees keys 6..10 only
        assert item.attn[..., 10, :6].abs().max() == 0 and item.attn[..., 10, 6:11].min() > 0


def test_tokens_read_as_the_text_and_sinks_are_bos(gpt2):
    _, path = gpt2
    item = text_attention(load_subject(path), TEXT)
    assert item.tokens[0] == EOT and "".join(item.tokens[1:]) == TEXT
    assert item.special == [True] + [False] * (len(item.tokens) - 1)
    assert item.sinks == [0] and item.text == TEXT and not item.truncated
    # byte-level pieces join into words: " quick" may be several tokens, "," is its own word
    words = [t for t, start in zip(item.tokens, item.word_starts, strict=True) if start]
    assert len(words) < len(item.tokens)


def test_without_bos_the_first_token_is_the_sink(tmp_path):
    hf = save_gpt2(tmp_path, bos=False)
    subject = load_subject(tmp_path)
    assert subject.prefix == [] and subject.sink_label == "the first token"
    analysis = analyze(subject, ["Hi"], probe=False)
    item = analysis.texts[0]
    assert item.sinks == [0] and not any(item.special) and item.tokens[0] == "H"
    torch.testing.assert_close(item.attn, hf_attentions(hf, subject.encode("Hi").ids))
    assert analysis.sink_label == "the first token"  # what a sink role names
    n = len(item.tokens)
    assert analysis.notes == [
        f"too short to measure: the text has {n} tokens, and roles measured on a text need at "
        "least 5; only the random-token probe's roles are given"
    ]


def test_a_tokenizer_that_adds_its_own_bos_keeps_it(tmp_path):
    """Llama-style: the post-processor puts a token first; config's bos_token_id is not added
    a second time (here it even names another token)."""
    from tokenizers import Tokenizer, processors

    save_gpt2(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOT} $A", special_tokens=[(EOT, eot)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    config = json.loads((tmp_path / "config.json").read_text())
    config["bos_token_id"] = 5
    (tmp_path / "config.json").write_text(json.dumps(config))
    subject = load_subject(tmp_path)
    assert subject.prefix == [eot] and subject.encode("A cat.").ids[:2] == [
        eot,
        tok.encode("A", add_special_tokens=False).ids[0],
    ]


def test_probe_uses_bos_and_the_models_own_vocabulary(gpt2, monkeypatch):
    from multihead.interpret import analysis as module

    _, path = gpt2
    subject = load_subject(path)
    seen = []
    real = module.attention_of_batch
    monkeypatch.setattr(
        module, "attention_of_batch", lambda s, batch: seen.extend(batch) or real(s, batch)
    )
    scores = module.copy_probe(subject, length=16, trials=4, seed=3)
    eot = subject.tokenizer.token_to_id(EOT)
    ordinary = subject.tokenizer.get_vocab_size() - 1  # every id but <|endoftext|>
    assert len(seen) == 4
    for ids in seen:
        assert ids[0] == eot and eot not in ids[1:] and max(ids[1:]) < ordinary
        body = ids[1:]
        assert body[:16] == body[-16:]  # R filler R
    assert set(scores) == {"duplicate", "induction", "induction_best", "induction_offset"}
    assert (scores["induction_best"] >= scores["induction"]).all()
    probe = analyze(subject, [TEXT]).probe
    assert str(probe).startswith(f"8 sequences {EOT} R filler R, R = 16 random tokens")


def test_short_text_and_truncation_notes(gpt2):
    _, path = gpt2
    subject = load_subject(path)
    short = analyze(subject, ["Hi"], probe=False)
    assert short.notes[0].startswith("too short to measure: the text has 2 tokens besides " + EOT)
    long = analyze(subject, [TEXT * 8], probe=False, max_tokens=20)
    item = long.texts[0]
    assert len(item.tokens) == 20 and item.truncated and item.tokens[0] == EOT
    assert long.notes[0].startswith(f"truncated: analysed the first 20 of {item.total_tokens}")
    assert (TEXT * 8).startswith(item.text) and "".join(item.tokens[1:]) == item.text
    with pytest.raises(ValueError, match=r"max_tokens must be in \[2, 64\]"):
        analyze(subject, [TEXT], max_tokens=65)


def test_a_causal_lm_that_carries_its_tokenizer_is_a_subject(gpt2):
    """A loaded CausalLM carries its tokenizer: it is read as load_subject reads the directory
    (the same tokens, Hugging Face's attentions); without one it is refused by name."""
    from multihead.pretrained import load_causal_lm

    hf, path = gpt2
    lm = load_causal_lm(path)
    subject = as_subject(lm)
    reference = load_subject(str(path))
    assert subject.encode(TEXT).ids == reference.encode(TEXT).ids
    got = analyze(lm, [TEXT], probe=False).texts[0]
    ids = subject.encode(TEXT).ids
    assert got.tokens == analyze(reference, [TEXT], probe=False).texts[0].tokens
    torch.testing.assert_close(got.attn, hf_attentions(hf, ids), atol=1e-5, rtol=1e-4)
    lm.tokenizer = None
    with pytest.raises(TypeError, match="carries no tokenizer"):
        as_subject(lm)
    with pytest.raises(TypeError, match="expected a SentenceEncoder or a Subject"):
        analyze(torch.nn.Linear(2, 2), [TEXT])


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    from multihead.pretrained import load_causal_lm
    from multihead.pretrained.tokenizer import read_tokenizer

    save_gpt2(tmp_path, extra_vocab=0)
    model = load_causal_lm(tmp_path)
    write_tokenizer(tmp_path, vocab_size=320)  # 20 more tokens than the model has rows
    with pytest.raises(
        ValueError, match="tokenizer has 321 tokens but the model's vocabulary holds 301"
    ):
        CausalLMSubject(model, read_tokenizer(tmp_path), bos_id=None)


# -- importance: against Hugging Face with the head's slice of the output projection zeroed --


def hf_token_losses(hf, ids_list, gates=None) -> torch.Tensor:
    """Next-token losses of every predicted token, each text run alone in Hugging Face;
    `gates` (L, H) scale each head's slice of c_proj's input (Conv1D rows)."""
    H = hf.config.n_head
    D = hf.config.n_embd // H
    handles = []
    if gates is not None:
        for layer, block in enumerate(hf.transformer.h):

            def scale(module, args, layer=layer):
                (x,) = args  # (B, T, C) = heads' outputs side by side
                B, T, C = x.shape
                return (x.view(B, T, H, D) * gates[layer][:, None]).view(B, T, C)

            handles.append(block.attn.c_proj.register_forward_pre_hook(scale))
    try:
        out = []
        for ids in ids_list:
            x = torch.tensor([ids])
            logits = hf(x).logits[0, :-1]
            out.append(F.cross_entropy(logits, x[0, 1:], reduction="none"))
        return torch.cat(out)
    finally:
        for h in handles:
            h.remove()


def test_ablation_importance_is_the_loss_change_of_zeroing_the_projection_slice(gpt2):
    hf, path = gpt2
    subject = load_subject(path)
    ids_list = [subject.encode(t).ids for t in TEXTS]
    ours = ablation_importance(subject, TEXTS, batch_size=2)  # padded batches
    L, H = 2, 3
    D = hf.config.n_embd // H
    expected = torch.zeros(L, H)
    with torch.no_grad():
        base = hf_token_losses(hf, ids_list).mean()
        for layer in range(L):
            for head in range(H):
                proj = hf.transformer.h[layer].attn.c_proj.weight  # Conv1D: (in, out)
                saved = proj.clone()
                proj[head * D : (head + 1) * D] = 0  # the head's input rows
                expected[layer, head] = hf_token_losses(hf, ids_list).mean() - base
                proj.copy_(saved)
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=1e-4)
    assert expected.abs().min() > 1e-3  # every head matters a little: the test can fail
    layers = layer_ablation_importance(subject, TEXTS, batch_size=1)
    assert layers.shape == (L,) and (layers != 0).all()


def test_gradient_importance_is_the_gradient_of_next_token_loss(gpt2):
    hf, path = gpt2
    subject = load_subject(path)
    ids_list = [subject.encode(t).ids for t in TEXTS]
    ours = gradient_importance(subject, TEXTS, batch_size=2)
    total = torch.zeros(2, 3)
    for batch in (ids_list[:2], ids_list[2:]):
        gates = torch.ones(2, 3, requires_grad=True)
        loss = hf_token_losses(hf, batch, gates).mean()  # the batch's mean over its tokens
        (grad,) = torch.autograd.grad(loss, gates)
        total += grad.abs()
    expected = total / total.norm(dim=1, keepdim=True)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)


def test_pruning_curve_runs_from_the_models_loss_to_no_heads(gpt2):
    hf, path = gpt2
    subject = load_subject(path)
    ids_list = [subject.encode(t).ids for t in TEXTS]
    curve = pruning_curve(subject, TEXTS, torch.rand(2, 3), step=6)
    with torch.no_grad():
        base = hf_token_losses(hf, ids_list).mean()
        none = hf_token_losses(hf, ids_list, torch.zeros(2, 3)).mean()
    assert [n for n, _ in curve] == [0, 6]
    assert curve[0][1] == pytest.approx(float(base), abs=1e-5)
    assert curve[1][1] == pytest.approx(float(none), abs=1e-5)
    with pytest.raises(
        ValueError, match=r"importance must have shape \(layers, heads\) = \(2, 3\)"
    ):
        pruning_curve(subject, TEXTS, torch.rand(3, 2))


def test_the_batched_probe_equals_one_forward_per_trial(gpt2):
    """The probe's trials run as one right-padded forward; each trial's pattern equals its own
    unpadded forward, so the scores are those of one forward per trial."""
    from multihead.interpret import analysis as module

    _, path = gpt2
    subject = load_subject(path)
    batch = [[5, 9, 11, 5, 9], [7, 8, 7, 8, 7, 8, 3], [4, 6]]
    for ids, padded in zip(batch, module.attention_of_batch(subject, batch), strict=True):
        torch.testing.assert_close(padded, module.attention_of(subject, ids), atol=1e-5, rtol=1e-4)


def test_the_probe_finds_an_induction_circuit_shifted_by_one(gpt2, monkeypatch):
    """A hand-built pattern in place of the model's: every query of the second copy attends to
    the token two after its earlier copy (a circuit whose previous-token step reads i-2)."""
    from multihead.interpret import analysis as module

    _, path = gpt2
    subject = load_subject(path)

    def shifted(s, ids):
        T, n = len(ids), 16
        first, second = 1, len(ids) - n  # [BOS] R filler R
        a = torch.zeros(2, 3, T, T)
        a[..., :, 0] = 1.0  # everything else on BOS
        for t in range(n - 2):
            q = second + t
            a[..., q, :] = 0
            a[..., q, first + t + 2] = 1.0
        return a

    monkeypatch.setattr(
        module, "attention_of_batch", lambda s, batch: [shifted(s, ids) for ids in batch]
    )
    scores = module.copy_probe(subject, trials=3, offsets=(1, 2, 3))
    assert scores["induction"].max() == 0 and scores["duplicate"].max() == 0
    torch.testing.assert_close(scores["induction_best"], torch.ones(2, 3))
    assert scores["induction_offset"].unique().tolist() == [2.0]


def test_offsets_and_thresholds_are_parameters(gpt2):
    from multihead.interpret.roles import with_thresholds

    _, path = gpt2
    subject = load_subject(path)
    default = analyze(subject, [TEXT])
    assert any(r.role == "broad" for row in default.roles for h in row for r in h)
    strict = with_thresholds({"broad": 0.999, "induction": 0.01})
    custom = analyze(subject, [TEXT], rules=strict, previous_distances=(3,), induction_offsets=(2,))
    assert custom.metrics["previous_distance"].unique().tolist() == [3.0]
    assert custom.metrics["induction_offset"].unique().tolist() == [2.0]
    roles = [r for row in custom.roles for h in row for r in h]
    assert not any(r.role == "broad" for r in roles)
    induction = [r for r in roles if r.role == "induction"]
    assert induction and all("offset +2 from the earlier copy" in r.description for r in induction)
    with pytest.raises(ValueError, match="unknown roles"):
        with_thresholds({"nonsense": 0.5})
    with pytest.raises(ValueError, match="must be a positive number"):
        with_thresholds({"broad": 0})
