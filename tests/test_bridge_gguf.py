"""A GGUF file whose architecture no native family reads, but transformers' GGUF support does,
loads through the bridge: a tiny random Starcoder2 with a byte-level BPE tokenizer trained here,
saved by transformers and converted to GGUF (f32) by llama.cpp's own converter. The bridged
model's logits equal transformers' eager run of the checkpoint directory, its hooks fire under
the native names, and its tokenizer is transformers' reading of the GGUF's metadata. A GGUF
architecture transformers cannot read is refused by name before any tensor is read; native
GGUF architectures keep loading natively."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import gguf
import transformers

from helpers_families import CHECK_TEXTS, bpe_tokenizer, convert, llama_cpp_dir
from multihead import load
from multihead.bridge import BridgedModel
from multihead.interpret import run_with_cache

T = 12


@pytest.fixture(scope="module")
def starcoder2(tmp_path_factory):
    """(checkpoint directory, its eager transformers model, the converted f32 GGUF)."""
    llama_cpp_dir()  # skips without llama.cpp's converter (fails under CI)
    root = tmp_path_factory.mktemp("starcoder2")
    folder = root / "hf"
    folder.mkdir()
    vocab = bpe_tokenizer(folder, "gpt2")
    config = transformers.Starcoder2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        sliding_window=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Starcoder2ForCausalLM(config)
    with torch.no_grad():  # norms and biases away from their initial 1 / 0
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    model.config._attn_implementation = "eager"
    path = root / "starcoder2.f32.gguf"
    job = {"model": str(folder), "outfile": str(path), "outtype": "f32", "pre": "starcoder"}
    convert([job], root)
    return folder, model.eval(), path


def test_gguf_loads_through_the_bridge(starcoder2):
    _, hf, path = starcoder2
    model = load(path)
    assert isinstance(model, BridgedModel)
    assert type(model.hf).__name__ == "Starcoder2ForCausalLM"
    ids = torch.randint(2, hf.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf(ids).logits
        logits = model(ids)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)

    _, cache = run_with_cache(model, ids)
    names = {"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z", "blocks.1.hook_resid_post"}
    assert names <= set(cache)
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert pattern.shape == (2, 4, T, T)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 4, T))
    with torch.no_grad():
        eager = hf(ids, output_attentions=True).attentions[0]
    torch.testing.assert_close(pattern, eager, atol=1e-5, rtol=0)


def test_gguf_tokenizer_is_transformers_reading(starcoder2):
    folder, _, path = starcoder2
    model = load(path)
    reference = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    original = transformers.AutoTokenizer.from_pretrained(folder)
    for text in CHECK_TEXTS:
        if not text:
            continue
        ids = model.to_tokens(text, prepend_bos=False)[0].tolist()
        assert ids == reference(text, add_special_tokens=False)["input_ids"], text
        assert ids == original(text, add_special_tokens=False)["input_ids"], text


def _gguf(path, arch: str) -> None:
    """A header transformers' GGUF reader can parse (one tiny tensor, never read)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_eps(1e-5)
    writer.add_feed_forward_length(16)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _no_tensor_read(*args, **kwargs):
    raise AssertionError("the model was built: its tensors were read")


def test_unreadable_gguf_architecture_is_refused_by_name(tmp_path, monkeypatch):
    path = tmp_path / "nonesuch.gguf"
    _gguf(path, "nonesuch")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", _no_tensor_read)
    with pytest.raises(ValueError, match=r"unsupported architecture 'nonesuch'.*transformers"):
        load(path)


def test_gguf_outside_the_registry_is_refused_by_name(tmp_path, monkeypatch):
    """Falcon: transformers reads its GGUF files, but its attention does not call the
    registry."""
    path = tmp_path / "falcon.gguf"
    _gguf(path, "falcon")
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", _no_tensor_read)
    with pytest.raises(ValueError, match=r"FalconForCausalLM \(model_type 'falcon'\).*registry"):
        load(path)


def test_cli_inspect_heads_and_syntax_load_the_gguf_through_the_bridge(
    starcoder2, tmp_path, capsys
):
    """The command line takes multihead.load's path: the bridged GGUF is a causal LM subject
    whose tokens are transformers' reading of the file's metadata."""
    from multihead.cli import main

    folder, _, path = starcoder2
    text = "def add(a, b): return a + b"
    out = tmp_path / "r.json"
    assert main(["inspect", text, "--model", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith(f"{path}: causal LM, 2 layers x 4 heads, ")
    data = json.loads(out.read_text())
    assert data["kind"] == "causal LM"
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    ids = reference(text, add_special_tokens=False)["input_ids"]
    # BOS (config bos_token_id 0) first, then the text as transformers tokenises it
    expected = [reference.convert_ids_to_tokens(0), *(reference.decode([i]) for i in ids)]
    assert data["tokens"] == expected
    assert data["special"][:2] == [True, False]
    assert "Roles measured on this text" in printed and "L1 H3" in printed

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("x = 1\nfor i in range(3): print(i)\n")
    assert main(["heads", "--corpus", str(corpus), "--model", str(path)]) == 0
    assert "L1 H3" in capsys.readouterr().out
    treebank = tmp_path / "t.conllu"
    treebank.write_text(
        "# text = x = y\n1\tx\tx\tNOUN\t_\t_\t2\tnsubj\t_\t_\n"
        "2\t=\t=\tVERB\t_\t_\t0\troot\t_\t_\n3\ty\ty\tNOUN\t_\t_\t2\tobj\t_\t_\n\n"
    )
    assert main(["syntax", str(treebank), "--model", str(path), "--min-count", "1"]) == 0
    assert "2 layers x 4 heads, 1 sentences" in capsys.readouterr().out


def test_cli_refuses_the_unreadable_gguf_as_load_does(tmp_path, monkeypatch, capsys):
    from multihead.cli import main

    path = tmp_path / "nonesuch.gguf"
    _gguf(path, "nonesuch")
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", _no_tensor_read)
    with pytest.raises(ValueError) as raised:
        load(path)
    assert main(["inspect", "some text", "--model", str(path), "-o", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"multihead: error: {raised.value}"]
    assert "unsupported architecture 'nonesuch'" in err[0]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("x = 1\n")
    assert main(["heads", "--corpus", str(corpus), "--model", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == err


def test_cli_refuses_an_encoder_decoder_gguf_before_loading(tmp_path, monkeypatch, capsys):
    """T5: transformers reads its GGUF files and the bridge routes it, but inspection reads
    causal LMs: refused by its general.architecture before any tensor is read."""
    from multihead.cli import main

    path = tmp_path / "t5.gguf"
    _gguf(path, "t5")
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", _no_tensor_read)
    assert main(["inspect", "some text", "--model", str(path), "-o", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: model ")
    assert "general.architecture 't5', an encoder-decoder" in err[0]
