"""Hostile checkpoints: absurd or contradictory configs over real (tiny) checkpoints must fail at
once, naming the field and what the weights say, before any module is built."""

import contextlib
import json
import os
import shutil
import signal

import pytest
import torch

from helpers_bert import save_bert
from helpers_gpt2 import save_gpt2
from helpers_llama import save_causal
from multihead.cli import main
from multihead.interpret.subject import load_subject
from multihead.pretrained import load_causal_lm, load_encoder

pytest.importorskip("transformers")


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging CI) when the body runs longer than `seconds`."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s: the loader built before checking")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    save_gpt2(root / "gpt2")
    save_bert(root / "bert")
    save_causal(root / "llama", "llama")
    return root


def altered(dirs, tmp_path, name, **fields):
    """A copy of model `name` whose config.json has `fields` replaced."""
    dst = tmp_path / f"{name}-altered"
    shutil.copytree(dirs / name, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_billion_layer_config_over_two_layer_gpt2_fails_at_once(dirs, tmp_path):
    path = altered(dirs, tmp_path, "gpt2", n_layer=1_000_000_000)
    for load in (load_causal_lm, load_subject):
        with deadline(20), pytest.raises(ValueError) as err:
            load(path)
        msg = str(err.value)
        assert "n_layer" in msg or "layers" in msg, msg
        assert "1000000000" in msg and "2" in msg, msg


def test_hundred_thousand_layer_bert_fails_at_once(dirs, tmp_path):
    path = altered(dirs, tmp_path, "bert", num_hidden_layers=100_000)
    for load in (load_encoder, load_subject):
        with deadline(20), pytest.raises(ValueError, match=r"100000 layers.*holds 2"):
            load(path)


def test_inspect_refuses_absurd_layer_count_in_one_line(dirs, tmp_path, capsys):
    path = altered(dirs, tmp_path, "gpt2", n_layer=1_000_000_000)
    with deadline(30):
        assert main(["inspect", "--model", str(path), "a cat", "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: ") and "1000000000" in err[0]


def test_fewer_layers_in_config_than_checkpoint_is_named(dirs, tmp_path):
    path = altered(dirs, tmp_path, "llama", num_hidden_layers=1)
    with pytest.raises(ValueError, match=r"1 layers.*holds 2"):
        load_causal_lm(path)


@pytest.mark.parametrize(
    ("name", "field", "value", "fragment"),
    [
        ("gpt2", "n_embd", 2**40, "n_embd"),
        ("gpt2", "vocab_size", 10**12, "vocab_size"),
        ("gpt2", "n_positions", 10**12, "n_positions"),
        ("gpt2", "layer_norm_epsilon", 5.0, "layer_norm_epsilon"),
        ("bert", "layer_norm_eps", 1e300, "layer_norm_eps"),
        ("bert", "hidden_size", 2**40, "hidden_size"),
        ("llama", "rope_theta", 0, "rope_theta"),
        ("llama", "rope_theta", 1e300, "rope_theta"),
        ("llama", "rms_norm_eps", 2.0, "rms_norm_eps"),
        ("llama", "num_attention_heads", 10**6, "num_attention_heads"),
    ],
)
def test_numeric_fields_out_of_range_named(dirs, tmp_path, name, field, value, fragment):
    path = altered(dirs, tmp_path, name, **{field: value})
    load = load_encoder if name == "bert" else load_causal_lm
    with deadline(20), pytest.raises(ValueError) as err:
        load(path)
    assert fragment in str(err.value) and repr(value) in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("scaling", "fragment"),
    [
        ({"rope_type": "linear", "factor": 1e9}, "factor"),
        ({"rope_type": "linear", "factor": 0.5}, "factor"),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 32,
            },
            "high_freq_factor",
        ),
    ],
)
def test_rope_scaling_ranges_named(dirs, tmp_path, scaling, fragment):
    path = altered(dirs, tmp_path, "llama", rope_scaling=scaling, rope_parameters=None)
    with pytest.raises(ValueError, match=fragment):
        load_causal_lm(path)


def test_sliding_window_range_named(dirs, tmp_path):
    path = altered(dirs, tmp_path, "llama", model_type="mistral", sliding_window=10**12)
    with pytest.raises(ValueError, match="sliding_window"):
        load_causal_lm(path)


def test_rope_theta_contradicting_rope_parameters_is_an_error(dirs, tmp_path):
    path = altered(
        dirs,
        tmp_path,
        "llama",
        rope_theta=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    with pytest.raises(ValueError, match=r"rope_theta .*got 0"):  # out of range, whichever wins
        load_causal_lm(path)
    path = altered(
        dirs,
        tmp_path / "b",
        "llama",
        rope_theta=500000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    with pytest.raises(ValueError, match=r"rope_theta 500000 disagrees.*rope_theta 10000"):
        load_causal_lm(path)


def test_agreeing_rope_fields_still_load(dirs, tmp_path):
    path = altered(
        dirs,
        tmp_path,
        "llama",
        rope_theta=10000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = load_causal_lm(path)
    assert model(torch.tensor([[1, 2, 3]])).shape[:2] == (1, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_cuda_on_a_cpu_only_torch_is_a_clear_error(dirs):
    for load, name in ((load_causal_lm, "gpt2"), (load_encoder, "bert")):
        with pytest.raises(ValueError, match=r"device 'cuda' is not available.*CUDA"):
            load(dirs / name, device="cuda")


def test_a_file_is_not_a_model_directory(dirs, tmp_path):
    weights = dirs / "gpt2" / "model.safetensors"
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    for path in (weights, text):  # says what it is and what it should be
        with pytest.raises(ValueError, match=rf"{path.name}' is a file.*\.gguf file"):
            load_causal_lm(path)


@pytest.mark.parametrize("path", ["../elsewhere", "/tmp", "1_Pooling/../../x"])
def test_pooling_path_outside_the_model_dir_is_refused(dirs, tmp_path, path):
    model = tmp_path / "st"
    shutil.copytree(dirs / "bert", model)
    (model / "1_Pooling").mkdir()
    (model / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 24, "pooling_mode_mean_tokens": True})
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": path, "type": "sentence_transformers.models.Pooling"},
    ]
    (model / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"Pooling's path .* must be a folder inside the model"):
        load_encoder(model)


# Issue 40: an empty model name, a model that is a named pipe, and FactoredMatrix dtypes.
@pytest.mark.parametrize("name", ["", "  "])
def test_load_of_an_empty_name_is_refused_not_the_current_directory(name, tmp_path, monkeypatch):
    import multihead

    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    monkeypatch.chdir(tmp_path)  # "" used to load the current directory
    with pytest.raises(ValueError, match=rf"model {name!r} is empty"):
        multihead.load(name)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_load_of_a_named_pipe_is_refused_without_blocking(tmp_path):
    import subprocess
    import sys

    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    code = f"import multihead\ntry:\n    multihead.load({str(fifo)!r})\nexcept ValueError as e:\n    print(e)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "is not a regular file" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_factored_matrix_of_non_float_tensors_is_a_type_error(dtype):
    from multihead import FactoredMatrix

    a = torch.ones(3, 2, dtype=dtype)
    with pytest.raises(TypeError, match=rf"A must be a floating-point .* got dtype {dtype}"):
        FactoredMatrix(a, torch.ones(2, 4))
    with pytest.raises(TypeError, match=rf"B must be a floating-point .* got dtype {dtype}"):
        FactoredMatrix(torch.ones(3, 2), torch.ones(2, 4, dtype=dtype))


def test_factored_matrix_of_two_float_dtypes_is_a_type_error():
    from multihead import FactoredMatrix

    with pytest.raises(TypeError, match=r"share a dtype, got torch.float32 and torch.float64"):
        FactoredMatrix(torch.ones(3, 2), torch.ones(2, 4, dtype=torch.float64))
    fm = FactoredMatrix(
        torch.randn(3, 2, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    )
    assert fm.eigenvalues.dtype == torch.complex128  # float works as before
