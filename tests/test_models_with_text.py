"""Models that carry their tokenizer: to_tokens / to_str_tokens / to_string and the calls that
take text, against transformers (its tokenizer and model on the same directory) and
TransformerLens' conventions. Random weights (tiny GPT-2 and Llama saved by transformers) and
the real MiniLM."""

from __future__ import annotations

import json

import pytest
import torch

from helpers_gpt2 import EOT, save_gpt2, write_sentencepiece_tokenizer
from helpers_llama import save_causal
from multihead.interpret import run_with_cache
from multihead.models.text import ModelTokenizer
from multihead.pretrained import load_causal_lm, load_encoder

TEXTS = ["the dog sleeps", "A cat sat on the mat. Stocks fell"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    hf = save_gpt2(directory, scale=3.0)
    return load_causal_lm(directory), hf, directory


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    hf = save_causal(directory, "llama")
    write_sentencepiece_tokenizer(directory)  # its template puts <s> first
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return load_causal_lm(directory), hf, directory


@pytest.fixture(scope="module")
def minilm():
    return load_encoder()


def _auto(directory):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(directory))


def test_loaded_models_carry_their_tokenizer(gpt2, llama, minilm):
    for model in (gpt2[0], llama[0], minilm):
        assert isinstance(model.tokenizer, ModelTokenizer)
        assert isinstance(model, torch.nn.Module)
    # BOS as trained: GPT-2 none (its <|endoftext|> id from config.json), Llama <s>, BERT [CLS]
    assert not gpt2[0].tokenizer.add_bos
    assert gpt2[0].tokenizer.bos_id == gpt2[0].tokenizer.token_to_id(EOT)
    assert llama[0].tokenizer.add_bos and minilm.tokenizer.add_bos


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_to_tokens_equals_transformers(request, which):
    model, _, directory = request.getfixturevalue(which)
    theirs = _auto(directory)
    for text in TEXTS:
        ids = model.to_tokens(text)
        assert ids.dtype == torch.long and ids.shape[0] == 1
        assert ids[0].tolist() == theirs(text)["input_ids"]
        assert model.to_string(ids[0]) == theirs.decode(ids[0].tolist())
        assert model.to_str_tokens(text) == [theirs.decode([i]) for i in ids[0].tolist()]


def test_prepend_bos_as_transformer_lens(gpt2, llama):
    model = gpt2[0]
    plain = model.to_tokens("the dog")[0].tolist()
    eot = model.tokenizer.token_to_id(EOT)
    assert model.to_tokens("the dog", prepend_bos=True)[0].tolist() == [eot, *plain]
    lm = llama[0]
    with_bos = lm.to_tokens("the dog")[0].tolist()
    assert with_bos[0] == lm.tokenizer.bos_id
    assert lm.to_tokens("the dog", prepend_bos=False)[0].tolist() == with_bos[1:]
    assert lm.to_str_tokens("the dog", prepend_bos=False) == lm.to_str_tokens("the dog")[1:]


def test_padding_and_mask(gpt2):
    model = gpt2[0]
    alone = [model.to_tokens(t)[0] for t in TEXTS]
    T = max(len(a) for a in alone)
    for side in ("right", "left"):
        ids, mask = model.to_tokens(TEXTS, padding_side=side, return_mask=True)
        assert ids.shape == mask.shape == (2, T)
        for row, a in enumerate(alone):
            real = ids[row][mask[row].bool()]
            assert torch.equal(real, a)
            where = torch.arange(T) < len(a) if side == "right" else torch.arange(T) >= T - len(a)
            assert torch.equal(mask[row].bool(), where)
    with pytest.raises(ValueError, match="padding_side must be"):
        model.to_tokens(TEXTS, padding_side="middle")


def test_to_str_tokens_forms(gpt2):
    model = gpt2[0]
    ids = model.to_tokens(TEXTS[0])
    expected = model.to_str_tokens(TEXTS[0])
    assert model.to_str_tokens(ids) == expected  # (1, T)
    assert model.to_str_tokens(ids[0]) == expected  # (T,)
    assert model.to_str_tokens(ids[0].tolist()) == expected
    assert model.to_str_tokens(TEXTS) == [model.to_str_tokens(t) for t in TEXTS]
    assert model.to_string(torch.cat([ids, ids])) == [TEXTS[0], TEXTS[0]]  # (B, T) -> a list
    with pytest.raises(ValueError, match="one sequence"):
        model.to_str_tokens(model.to_tokens(TEXTS))
    one = model.to_single_token(" dog")
    assert model.to_str_tokens([one]) == [" dog"]
    with pytest.raises(ValueError, match="not one"):
        model.to_single_token("the dog sleeps")


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_forward_on_text_equals_transformers(request, which):
    """A padded list of texts: each row's logits at its real tokens equal transformers' on that
    text alone (right padding, mask passed by the model itself)."""
    model, hf, directory = request.getfixturevalue(which)
    logits = model(TEXTS)
    theirs = _auto(directory)
    for row, text in enumerate(TEXTS):
        ids = torch.tensor([theirs(text)["input_ids"]])
        with torch.no_grad():
            expected = hf(ids).logits[0]
        torch.testing.assert_close(logits[row, : ids.shape[1]], expected, atol=1e-4, rtol=1e-4)
    out, cache = model.run_with_cache(TEXTS[0])
    torch.testing.assert_close(out, model(model.to_tokens(TEXTS[0])))
    _, by_function = run_with_cache(model, model.to_tokens(TEXTS[0]))
    torch.testing.assert_close(cache["pattern", 1], by_function["pattern", 1])


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_generate_text_equals_transformers(request, which):
    """Greedy: the same text as transformers' generate on the same prompt; a list of prompts
    (left-padded by the model) gives each prompt's own continuation."""
    model, hf, directory = request.getfixturevalue(which)
    theirs = _auto(directory)
    texts = model.generate(TEXTS, 6, eos=None)
    for text, got in zip(TEXTS, texts, strict=True):
        ids = torch.tensor([theirs(text)["input_ids"]])
        with torch.no_grad():
            expected = hf.generate(
                ids, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        skip = model.tokenizer.add_bos  # the BOS put first is not part of the text
        assert got == theirs.decode(expected[0, int(skip) :].tolist())
        assert model.generate(text, 6, eos=None) == got
    tokens = model.generate(TEXTS[0], 6, eos=None, return_type="tokens")
    assert tokens.shape == (1, model.to_tokens(TEXTS[0]).shape[1] + 6)


def test_generate_stops_at_eos(gpt2):
    model = gpt2[0]
    eot = model.tokenizer.token_to_id(EOT)
    prompt = model.to_tokens("the dog")
    free = model.generate(prompt, 8)  # ids: no eos
    first = free[0, prompt.shape[1]].item()
    model.tokenizer.eos_id = first  # the first new token now counts as EOS
    try:
        text = model.generate("the dog", 8)
        assert text == model.to_string(free[0, : prompt.shape[1] + 1])
    finally:
        model.tokenizer.eos_id = eot


def test_ablate_and_patch_take_text(gpt2):
    model = gpt2[0]
    ids = model.to_tokens(TEXTS[0])
    with model.ablate([(0, 1)], "mean", reference=TEXTS):
        by_text = model(ids)
    ref, mask = model.to_tokens(TEXTS, return_mask=True)
    with model.ablate([(0, 1)], "mean", reference=ref, reference_mask=mask):
        by_ids = model(ids)
    torch.testing.assert_close(by_text, by_ids)
    assert not torch.allclose(by_ids, model(ids))

    dog, cat = model.to_single_token(" dog"), model.to_single_token(" the")

    def metric(logits):
        return logits[0, -1, dog] - logits[0, -1, cat]

    clean, corrupt = "the dog sleeps", "the river sleeps"
    got = model.patch(clean, corrupt, metric)
    expected = model.patch(model.to_tokens(clean), model.to_tokens(corrupt), metric)
    torch.testing.assert_close(got.heads, expected.heads)
    with pytest.raises(ValueError, match="token ids differ in shape"):
        model.patch("the dog", "the dog sleeps now", metric)


def test_minilm_text_equals_transformers(minilm):
    from helpers_encoders import SENTENCES

    directory = minilm.source
    theirs = _auto(directory)
    ids, mask = minilm.to_tokens(SENTENCES[:3], return_mask=True)
    expected = theirs(SENTENCES[:3], padding=True, return_tensors="pt")
    assert torch.equal(ids, expected["input_ids"]) and torch.equal(mask, expected["attention_mask"])
    assert minilm.to_str_tokens("Hello world") == ["[CLS]", "hello", "world", "[SEP]"]
    states = minilm(SENTENCES[:3]).last_hidden_state
    torch.testing.assert_close(states, minilm(ids, mask).last_hidden_state)
    # texts are cut to max_seq_length (256), [SEP] kept, as sentence-transformers does
    long = minilm.to_tokens("word " * 400)
    assert long.shape == (1, minilm.max_seq_length) and long[0, -1] == minilm.tokenizer.eos_id


def test_text_without_tokenizer(gpt2):
    model = gpt2[0]
    saved, model.tokenizer = model.tokenizer, None
    try:
        for call in (
            lambda: model.to_tokens("a"),
            lambda: model("a"),
            lambda: model.generate("a", 2),
            lambda: model.run_with_cache("a"),
        ):
            with pytest.raises(ValueError, match="carries no tokenizer"):
                call()
        assert model.generate(torch.tensor([[1, 2]]), 2).shape == (1, 4)  # ids still work
    finally:
        model.tokenizer = saved
    with pytest.raises(TypeError, match="input must be a str"):
        model.to_tokens(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attention_mask is made from the text"):
        model(TEXTS, attention_mask=torch.ones(2, 3))
