"""sentence-transformers directories saved before v3, with the Transformer's files in a subfolder
that modules.json names (0_Transformer/): loaded as sentence-transformers loads them, by the
library and the command line; a modules.json pointing elsewhere is refused by name."""

import json
import shutil

import numpy as np
import pytest

from helpers_encoders import SENTENCES, save_encoder, save_sentence_transformer
from multihead.cli import main
from multihead.model_layout import transformer_folder
from multihead.pretrained import load_encoder

pytest.importorskip("transformers")

TOP_LEVEL = ("modules.json", "config_sentence_transformers.json", "README.md")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("mpnet") / "model"
    save_encoder(path, "mpnet")
    return path


def _old_layout(root, model_dir, *, pooling="mean", normalize=True, settings_name=None):
    """A sentence-transformers directory rearranged as version 2 saved it: the Transformer's
    files in 0_Transformer/, modules.json's entry naming it with the old class path."""
    save_sentence_transformer(root, model_dir, pooling, normalize=normalize, max_seq_length=20)
    sub = root / "0_Transformer"
    sub.mkdir()
    for path in list(root.iterdir()):
        if path.is_file() and path.name not in TOP_LEVEL:
            shutil.move(str(path), sub / path.name)
    if settings_name is not None:  # an older file name, and a length tokenizer_config lacks
        settings = json.loads((sub / "sentence_bert_config.json").read_text())
        (sub / "sentence_bert_config.json").unlink()
        (sub / settings_name).write_text(json.dumps({**settings, "max_seq_length": 12}))
    modules = json.loads((root / "modules.json").read_text())
    modules[0].update(path="0_Transformer", type="sentence_transformers.models.Transformer")
    (root / "modules.json").write_text(json.dumps(modules))
    assert not (root / "config.json").exists() and (sub / "config.json").is_file()
    return root


@pytest.mark.parametrize(
    ("pooling", "normalize", "settings_name"),
    [("mean", True, None), ("cls", False, "sentence_roberta_config.json")],
)
def test_old_layout_matches_sentence_transformers(
    model_dir, tmp_path, pooling, normalize, settings_name
):
    st = pytest.importorskip("sentence_transformers")
    root = _old_layout(
        tmp_path, model_dir, pooling=pooling, normalize=normalize, settings_name=settings_name
    )
    assert transformer_folder(root) == root / "0_Transformer"
    reference = st.SentenceTransformer(str(root), device="cpu")
    enc = load_encoder(root)
    # max_seq_length is read from the subfolder's settings file, as sentence-transformers does
    assert enc.max_seq_length == reference.max_seq_length == (12 if settings_name else 20)
    assert enc.pooling == (pooling,) and enc.normalize == normalize
    assert enc.source == root
    texts = [*SENTENCES, " ".join(SENTENCES)]  # the last one is truncated
    ours, ref = enc.encode(texts), reference.encode(texts)
    assert np.abs(ours - ref).max() <= 1e-5


def test_commands_read_the_old_layout(model_dir, tmp_path, capsys):
    root = _old_layout(tmp_path / "st", model_dir)
    capsys.readouterr()  # what saving printed
    assert main(["embed", "--model", str(root), SENTENCES[0]]) == 0
    line = json.loads(capsys.readouterr().out)
    expected = load_encoder(root).encode(SENTENCES[0])
    assert np.abs(np.array(line["embedding"]) - expected).max() <= 1e-6


def _modules_path(root, path):
    modules = json.loads((root / "modules.json").read_text())
    modules[0]["path"] = path
    (root / "modules.json").write_text(json.dumps(modules))


@pytest.mark.parametrize(
    ("edit", "library", "command"),
    [
        (
            lambda root: _modules_path(root, "../elsewhere"),
            "the Transformer's path '../elsewhere' must be a folder inside the model directory",
            "must be a folder inside the model directory",
        ),
        (
            lambda root: _modules_path(root, "0_Missing"),
            "names '0_Missing', which is not a folder in the model directory",
            "names '0_Missing', which is not a folder",
        ),
        (
            lambda root: (root / "0_Transformer" / "tokenizer.json").unlink(),
            "(its Transformer's folder '0_Transformer') lacks tokenizer.json",
            "its Transformer's folder '0_Transformer' (as modules.json says) lacks tokenizer.json",
        ),
        (
            lambda root: (root / "0_Transformer" / "model.safetensors").unlink(),
            "(its Transformer's folder '0_Transformer') lacks model.safetensors",
            "lacks model.safetensors or pytorch_model.bin",
        ),
    ],
)
def test_a_broken_layout_is_refused_by_name(model_dir, tmp_path, capsys, edit, library, command):
    root = _old_layout(tmp_path / "st", model_dir)
    edit(root)
    capsys.readouterr()  # what saving printed
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        load_encoder(root)
    assert library in str(info.value)
    assert main(["similarity", "--model", str(root), "a", "b"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: model ")
    assert command in err[0]


def test_top_level_layout_is_unchanged(model_dir, tmp_path):
    save_sentence_transformer(tmp_path, model_dir, "mean", normalize=True)
    assert json.loads((tmp_path / "modules.json").read_text())[0]["path"] == ""
    assert transformer_folder(tmp_path) == tmp_path
    assert transformer_folder(model_dir) == model_dir  # no modules.json at all
