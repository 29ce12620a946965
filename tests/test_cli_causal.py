"""`multihead inspect` and `multihead heads` on a GPT-2 directory (random weights saved by
`transformers`, a byte-level BPE tokenizer.json), and the causal report in every format."""

import json
import re
import shutil

import numpy as np
import pytest
import torch

from helpers_gpt2 import EOT, save_gpt2
from multihead.cli import main

pytest.importorskip("transformers")

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    save_gpt2(path, n_layer=2, n_head=3, n_embd=24, scale=3.0)
    return path


def test_inspect_prints_the_role_tables_and_writes_html(gpt2, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["inspect", TEXT, "--model", str(gpt2), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[0]
    assert header.startswith(f"{gpt2}: causal LM, 2 layers x 3 heads, ")
    assert f"tokens analysed: {EOT}|The|" in header  # tokens carry their spaces: "|" between
    assert f"sinks measured on {EOT}" in printed
    text_part, probe_part = printed.split("Roles measured on repeated random tokens")
    assert "Roles measured on this text" in text_part
    assert "head   role" in text_part  # the table, with at least one row
    assert any(line.startswith("L") and "x  " in line for line in text_part.splitlines())
    assert f"({'8 sequences ' + EOT} R filler R, R = 16 random tokens" in probe_part
    assert f"report: {out.resolve()}" in printed
    page = out.read_text()
    assert '"causal":true' in page and '"kind":"causal LM"' in page
    assert '"undefined":{"next":' in page  # the metrics table says n/a, not 0


def test_inspect_writes_json_and_png(gpt2, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["inspect", TEXT, "--model", str(gpt2), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    T = len(data["tokens"])
    assert data["kind"] == "causal LM" and data["causal"] is True
    assert data["tokens"][0] == EOT and "".join(data["tokens"][1:]) == TEXT
    assert data["special"] == [True] + [False] * (T - 1) and data["sink_positions"] == [0]
    assert data["metrics"]["next"] is None and "next" in data["undefined"]
    weights = np.array(data["weights"]["values"])
    assert weights.shape == (2, 3, T, T)
    assert (weights[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    np.testing.assert_allclose(weights.sum(-1) * data["weights"]["unit"], 1, atol=5e-3)
    assert data["metrics"]["previous_distance"][0][0] in (1, 2, 3, 4)

    from matplotlib.image import imread

    for args in ([], ["--layer", "1", "--head", "2"]):
        png = tmp_path / "r.png"
        assert main(["inspect", TEXT, "--model", str(gpt2), "-o", str(png), *args]) == 0
        image = imread(png)[..., :3]
        grey = np.abs(image - 222 / 255).max(-1) < 0.01  # the upper triangle's colour
        assert grey.mean() > 0.05, args  # a causal heatmap greys out what it cannot see
    capsys.readouterr()


def test_heads_over_a_corpus_with_next_token_importance(gpt2, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\nA dog barked twice.\nStocks fell today.\n")
    argv = ["heads", "--corpus", str(corpus), "--model", str(gpt2), "--importance", "--top", "6"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{gpt2} (causal LM) over 3 texts (means; padding excluded)"
    assert out[1] == "next: n/a, a causal head never attends to a later token"
    columns = out[2].split()
    assert columns[:5] == ["head", "role", "95%", "CI", "previous"] and columns[-1] == "ablation"
    rows = [re.split(r"\s{2,}", line.strip()) for line in out if line.startswith("L")]
    assert len(rows) == 6 and all(row[4] == "n/a" for row in rows)  # head, role, CI, previous, next
    assert (
        out[-1]
        == "ablation: increase of the next-token loss (nats per token) when the head is zeroed"
    )

    from multihead.interpret.importance import ablation_importance
    from multihead.interpret.subject import load_subject

    texts = corpus.read_text().splitlines()
    expected = ablation_importance(load_subject(gpt2), texts)
    for row in rows:
        layer, head = (int(x[1:]) for x in row[0].split())
        assert float(row[-1]) == pytest.approx(float(expected[layer, head]), abs=6e-4)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--max-tokens", "65"], ["--max-tokens must be in [3, 64]", "got 65"]),
        (["--layer", "2", "--head", "0"], ["out of range", "layers 0..1, heads 0..2"]),
    ],
)
def test_inspect_gpt2_argument_problems(gpt2, tmp_path, capsys, monkeypatch, args, fragments):
    def refuse(*a, **kw):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("multihead.pretrained.load_causal_lm", refuse)
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", TEXT, "--model", str(gpt2), *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: ")
    for fragment in fragments:
        assert fragment in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_broken_gpt2_checkpoint_is_one_line(gpt2, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    shutil.copytree(gpt2, tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    weights["transformer.h.0.ln_1.weight"] = torch.ones(5)
    save_file(weights, tmp_path / "m" / "model.safetensors")
    assert (
        main(["inspect", TEXT, "--model", str(tmp_path / "m"), "-o", str(tmp_path / "r.html")]) == 2
    )
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "layers.0.norm1.weight: checkpoint (5,)" in err[0]
    assert not (tmp_path / "r.html").exists()


def test_inspect_a_llama_directory(tmp_path, capsys):
    from helpers_gpt2 import write_sentencepiece_tokenizer
    from helpers_llama import save_causal

    model = tmp_path / "llama"
    special = write_sentencepiece_tokenizer(model)
    save_causal(model, "llama", vocab_size=special["size"], bos_token_id=special["<s>"])
    out = tmp_path / "r.json"
    assert main(["inspect", TEXT, "--model", str(model), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{model}: causal LM, 2 layers x 4 heads, ")
    assert "sinks measured on <s>" in printed
    data = json.loads(out.read_text())
    assert data["tokens"][0] == "<s>" and "".join(data["tokens"][1:]).strip() == TEXT
    assert data["causal"] is True and data["sinks"] == "<s>"
