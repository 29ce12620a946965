"""One way to name a model (multihead.models.source.resolve_model): a directory, a .gguf file,
the packaged default, a Hub id in a temporary Hugging Face cache laid out as huggingface_hub
writes it (models--org--name/refs/<ref> holding a commit, snapshots/<commit>/<files>)."""

from __future__ import annotations

import re
import shutil
import time

import pytest
import torch

import multihead
from helpers_gguf import write_gguf
from helpers_llama import save_causal
from multihead.cli import main
from multihead.models import load_causal_lm
from multihead.models.source import ModelNotFoundError, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def cache_entry(cache, repo, commit, ref="main"):
    """An empty snapshot `commit` of `repo` in `cache`, `ref` pointing at it; its folder."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    folder = root / "snapshots" / commit
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def hub(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # belt and braces: nothing may be fetched
    return cache


def ids():
    return torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])


def test_hub_id_reads_the_snapshot_its_ref_names(hub, tmp_path):
    main_model = save_causal(cache_entry(hub, "org/tiny", COMMIT), "llama", seed=1)
    other = save_causal(cache_entry(hub, "org/tiny", OTHER, ref="v2"), "llama", seed=2)
    source = resolve_model("org/tiny")
    assert source.kind == "hub" and source.revision == COMMIT
    with torch.no_grad():
        ours = load_causal_lm("org/tiny")(ids())
        torch.testing.assert_close(ours, main_model(ids()).logits, atol=1e-5, rtol=1e-4)
        for revision in ("v2", OTHER):  # a ref name or a commit
            ours = load_causal_lm(f"org/tiny@{revision}")(ids())
            torch.testing.assert_close(ours, other(ids()).logits, atol=1e-5, rtol=1e-4)
    assert type(multihead.load("org/tiny@v2")).__name__ == "CausalLM"


def test_hub_cache_found_through_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    folder = cache_entry(tmp_path / "home" / "hub", "org/tiny", COMMIT)
    save_causal(folder, "qwen2")
    assert resolve_model("org/tiny").path == folder


def test_hub_snapshot_holding_one_gguf_file(hub):
    folder = cache_entry(hub, "org/tiny-GGUF", COMMIT)
    model = write_gguf(folder / "tiny.Q8_0.gguf", "llama", "F32")
    source = resolve_model("org/tiny-GGUF")
    assert source.is_gguf and source.path == folder / "tiny.Q8_0.gguf"
    with torch.no_grad():
        torch.testing.assert_close(
            load_causal_lm("org/tiny-GGUF")(ids()), model(ids()).logits, atol=1e-5, rtol=1e-4
        )


def test_absent_hub_id_is_one_fast_error_naming_the_cache_and_the_fetch(hub):
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("org/absent@v1")
    assert time.perf_counter() - start < 30  # generous: no network wait, no download
    message = str(e.value)
    assert "'org/absent@v1'" in message and "not in the Hugging Face cache" in message
    assert str(hub / "models--org--absent") in message
    assert "`hf download org/absent --revision v1`" in message
    assert isinstance(e.value, ValueError) and isinstance(e.value, FileNotFoundError)
    assert list(hub.iterdir()) == []  # nothing written, nothing downloaded


def test_cache_entry_without_weights(hub):
    folder = cache_entry(hub, "org/partial", COMMIT)
    save_causal(folder, "llama")
    (folder / "model.safetensors").unlink()
    with pytest.raises(
        ValueError, match=r"has config.json but no weights.*hf download org/partial"
    ):
        resolve_model("org/partial")
    empty = cache_entry(hub, "org/empty", COMMIT)
    assert empty.is_dir()
    with pytest.raises(ValueError, match=r"neither config\.json with weights nor a \.gguf file"):
        resolve_model("org/empty")


def test_snapshot_with_several_gguf_files_asks_for_one(hub):
    folder = cache_entry(hub, "org/many", COMMIT)
    write_gguf(folder / "a.gguf", "llama", "F32")
    shutil.copy(folder / "a.gguf", folder / "b.gguf")
    with pytest.raises(ValueError, match=r"holds 2 .gguf files \(a.gguf, b.gguf\)"):
        resolve_model("org/many")


def test_directory_gguf_and_packaged_default(tmp_path):
    save_causal(tmp_path / "d", "llama")
    assert resolve_model(tmp_path / "d").kind == "directory"
    write_gguf(tmp_path / "m.gguf", "gpt2", "F32")
    assert resolve_model(str(tmp_path / "m.gguf")).kind == "gguf"
    default = resolve_model(None)
    assert default.kind == "packaged" and (default.path / "modules.json").is_file()
    assert resolve_model("all-MiniLM-L6-v2").path == default.path


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("./nowhere", "does not exist (no such directory or .gguf file)"),
        ("nowhere.gguf", "does not exist (no such .gguf file)"),
        ("not an id!", "neither a packaged model name"),
    ],
)
def test_names_that_resolve_to_nothing(hub, name, fragment):
    with pytest.raises(ModelNotFoundError, match=re.escape(fragment)):
        resolve_model(name)


def test_a_file_that_is_not_gguf(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="is a file but not a GGUF file"):
        resolve_model(tmp_path / "weights.bin")


def test_cli_reports_an_absent_hub_id_in_one_line(hub, capsys, tmp_path):
    assert main(["inspect", "x", "--model", "org/absent", "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: model 'org/absent'")
    assert "hf download org/absent" in err[0]
    assert not (tmp_path / "r.html").exists()


def test_multihead_load_picks_the_family_from_the_checkpoint(tmp_path):
    encoder = multihead.load()  # the packaged all-MiniLM-L6-v2
    assert type(encoder).__name__ == "SentenceEncoder"
    assert encoder.encode(["a cat"]).shape == (1, 384)
    save_causal(tmp_path / "lm", "mistral-window")
    assert type(multihead.load(tmp_path / "lm")).__name__ == "CausalLM"
    (tmp_path / "odd").mkdir()  # neither native nor known to transformers (the bridge's peer)
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "no-such-family"}')
    with pytest.raises(ValueError, match="unsupported architecture: it is neither a native"):
        multihead.load(tmp_path / "odd")
