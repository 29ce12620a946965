"""The library owns the checks a model gets before loading (multihead.models.check): torch-free,
run by multihead.load and by the command line's --model, with one message for one bad model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import multihead
from helpers_bert import save_bert
from multihead.cli import main
from multihead.models import ModelCheckError, check_model
from multihead.models.source import ModelNotFoundError

SRC = str(Path(multihead.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A small BERT directory and broken copies of it, one fault each."""
    root = tmp_path_factory.mktemp("checks")
    good = root / "good"
    save_bert(good)

    def copy(name: str) -> Path:
        shutil.copytree(good, root / name)
        return root / name

    (copy("no-config") / "config.json").unlink()
    (copy("bad-json") / "config.json").write_text('{"model_type": "bert",')
    (copy("list-config") / "config.json").write_text("[1, 2]")
    weights = copy("truncated") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (copy("no-weights") / "model.safetensors").unlink()
    binary = copy("bad-bin")
    (binary / "model.safetensors").unlink()
    (binary / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")
    shards = copy("missing-shard")
    (shards / "model.safetensors").unlink()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (shards / "model.safetensors.index.json").write_text(json.dumps(index))
    (copy("bad-tokenizer") / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    config = copy("small-vocab") / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "vocab_size": 5}))
    layout = copy("bad-modules-json")
    (layout / "modules.json").write_text('[{"type": "sentence_transformers.models.Transformer"')
    (root / "not-a-model.bin").write_bytes(b"not a model")
    return root


BAD = {
    "no-config": "the directory lacks config.json",
    "bad-json": "config.json is not valid JSON",
    "list-config": "config.json must hold a JSON object, got list",
    "truncated": "model.safetensors is truncated or corrupted",
    "no-weights": "lacks model.safetensors or pytorch_model.bin",
    "bad-bin": "pytorch_model.bin is truncated or not a PyTorch checkpoint",
    "missing-shard": "names shards that are missing: model-00001-of-00002.safetensors",
    "bad-tokenizer": "tokenizer.json cannot be read as a tokenizer",
    "small-vocab": "but config.json's vocab_size is 5",
    "bad-modules-json": "modules.json",
    "not-a-model.bin": "is a file but not a GGUF file",
    "absent": "does not exist",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_one_bad_model_one_message_from_load_and_from_the_command_line(
    models, name, capsys, tmp_path
):
    path = str(models / name)
    with pytest.raises(ValueError) as raised:  # ModelCheckError or ModelNotFoundError
        multihead.load(path)
    message = str(raised.value)
    assert isinstance(raised.value, (ModelCheckError, ModelNotFoundError))
    assert message.startswith(f"model {path!r}") and BAD[name] in message
    capsys.readouterr()
    out = tmp_path / "e.npy"
    assert main(["embed", "some text", "--model", path, "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"multihead: error: {message}"]
    assert not out.exists()


def test_the_check_reads_a_good_model(models):
    model = check_model(models / "good", tokenizer=True)
    assert model.model_type == "bert" and model.path == models / "good"
    assert (
        model.layers
        == json.loads((models / "good" / "config.json").read_text())["num_hidden_layers"]
    )
    # a model without tokenizer.json loads for token ids; a command that reads text refuses it
    bare = models.parent / "bare"
    shutil.copytree(models / "good", bare)
    (bare / "tokenizer.json").unlink()
    assert check_model(bare).model_type == "bert"  # tokenizer=None: checked where present
    with pytest.raises(ModelCheckError, match=r"lacks tokenizer\.json"):
        check_model(bare, tokenizer=True)
    assert check_model(bare, tokenizer=False).model_type == "bert"


def test_unsupported_architecture_is_named_before_missing_files(tmp_path):
    (tmp_path / "odd").mkdir()  # no native family, and transformers (the bridge) knows none
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "no-such-family"}')
    with pytest.raises(ModelCheckError, match=r"unsupported architecture: it is neither a native"):
        multihead.load(tmp_path / "odd")
    with pytest.raises(ModelCheckError, match=r"lacks model\.safetensors"):  # no list: any type
        check_model(tmp_path / "odd")
    (tmp_path / "t5").mkdir()  # the bridge builds T5: its missing weights are what is wrong
    (tmp_path / "t5" / "config.json").write_text('{"model_type": "t5"}')
    with pytest.raises(ModelCheckError, match=r"lacks model\.safetensors"):
        multihead.load(tmp_path / "t5")


CHECK_WITHOUT_TORCH = """
import sys
from multihead.models import ModelCheckError, check_model
try:
    check_model(sys.argv[1], tokenizer=True)
except ModelCheckError as e:
    print("error:", e)
else:
    print("ok")
print("torch imported:", "torch" in sys.modules)
"""


@pytest.mark.parametrize("name", ["good", "truncated", "bad-tokenizer", "missing-shard"])
def test_the_check_imports_no_torch(models, name):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run(
        [sys.executable, "-c", CHECK_WITHOUT_TORCH, str(models / name)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == "torch imported: False"
    assert (lines[0] == "ok") == (name == "good"), lines
