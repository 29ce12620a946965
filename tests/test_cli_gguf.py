"""The command line on GGUF files: `inspect --model file.gguf` (the tokenizer from the file's
metadata, BOS from tokenizer.ggml.bos_token_id) and `bench load` (fresh process per load)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers_gguf import write_gguf
from multihead.cli import main
from multihead.models import load_causal_lm

TEXT = "abc!#$abc"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, "llama", "Q8_0")
    return path


def test_inspect_a_gguf_file(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["inspect", TEXT, "--model", str(tiny_gguf), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith(f"{tiny_gguf}: causal LM, 2 layers x 4 heads, ")
    data = json.loads(out.read_text())
    assert data["kind"] == "causal LM"
    # BOS (the file's <|end|>, id VOCAB - 1) first, then "abc" merged into one token
    assert data["tokens"][:3] == ["<|end|>", "abc", "!"]
    assert data["special"][:2] == [True, False]


def test_inspect_refuses_a_gguf_without_tokenizer(tmp_path, capsys):
    path = tmp_path / "bare.gguf"
    write_gguf(path, "llama", "F32", tokenizer=None)
    assert main(["inspect", TEXT, "--model", str(path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "carries no tokenizer (tokenizer.ggml.tokens)" in err[0]
    assert not (tmp_path / "r.html").exists()


def test_bench_load_without_the_peer(tiny_gguf, capsys):
    argv = ["bench", "load", "--model", str(tiny_gguf), "--skip-peer", "--dtype", "bf16"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    (cells,) = [line.split() for line in printed.splitlines() if line.startswith("multihead  ")]
    assert cells[1] == "bf16" and float(cells[2]) > 0  # seconds
    model = load_causal_lm(tiny_gguf, dtype=torch.bfloat16)
    size = sum({t.data_ptr(): t.nbytes for t in model.state_dict().values()}.values())
    assert cells[5] == f"{size / 2**20:.1f}"  # the loaded model's size, tied head once
    assert "transformers" not in printed


def test_bench_load_refuses_a_directory(tmp_path, capsys):
    from helpers_llama import save_causal

    save_causal(tmp_path / "d", "llama")
    assert main(["bench", "load", "--model", str(tmp_path / "d"), "--skip-peer"]) == 2
    assert "bench load measures GGUF files" in capsys.readouterr().err
