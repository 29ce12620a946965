"""Corrupt and hostile checkpoint files, generated here: each must end in one clear error naming
the file and what is wrong (never a silent load, a hang, or code run from a pickle)."""

import json
import os
import pickle
import shutil
import struct

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from helpers_gpt2 import save_gpt2
from multihead.pretrained import load_causal_lm

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    save_gpt2(path)
    return path


def split(path):
    """(header dict, data bytes) of a safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join(path, header, data):
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def copy(gpt2, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(gpt2, dst)
    return dst


def two_same_shape(header):
    """Two tensors of the same dtype and shape (layer 0's and layer 1's c_proj weights)."""
    return "transformer.h.0.attn.c_proj.weight", "transformer.h.1.attn.c_proj.weight"


def test_aliased_tensors_are_refused_like_safetensors_does(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    weights = path / "model.safetensors"
    header, data = split(weights)
    a, b = two_same_shape(header)
    header[b]["data_offsets"] = header[a]["data_offsets"]  # layer 1 reads layer 0's bytes
    join(weights, header, data)
    with pytest.raises(SafetensorError):  # the format's own reader refuses it too
        load_file(weights)
    with pytest.raises(ValueError, match=r"model.safetensors.*overlap"):
        load_causal_lm(path)


def test_hole_between_tensors_is_refused(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    weights = path / "model.safetensors"
    header, data = split(weights)
    entries = sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"),
        key=lambda kv: kv[1]["data_offsets"][0],
    )
    # shift the last tensor 8 bytes on (the file grows by 8): 8 bytes no tensor owns
    _, last = entries[-1]
    begin, end = last["data_offsets"]
    last["data_offsets"] = [begin + 8, end + 8]
    join(weights, header, data[:begin] + bytes(8) + data[begin:])
    with pytest.raises(SafetensorError):
        load_file(weights)
    with pytest.raises(ValueError, match=r"model.safetensors.*hole"):
        load_causal_lm(path)


def test_trailing_bytes_after_the_last_tensor_are_refused(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0" * 16)
    with pytest.raises(ValueError, match=r"model.safetensors.*16 bytes after the last tensor"):
        load_causal_lm(path)


def test_dtype_size_mismatch_is_refused(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    weights = path / "model.safetensors"
    header, data = split(weights)
    header["transformer.wte.weight"]["dtype"] = "F16"  # half the bytes the span holds
    join(weights, header, data)
    with pytest.raises(
        ValueError, match=r"model.safetensors.*'transformer.wte.weight' spans bytes"
    ):
        load_causal_lm(path)


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.5, 0.999])
def test_truncated_file_is_refused(gpt2, tmp_path, fraction):
    path = copy(gpt2, tmp_path)
    weights = path / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes(raw[: int(len(raw) * fraction)])
    with pytest.raises(ValueError, match=r"model.safetensors.*(corrupted or truncated)"):
        load_causal_lm(path)


def test_wrong_shape_tensor_is_named(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(24, 95)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"layers.1.ffn.fc1.weight: checkpoint \(95, 24\)"):
        load_causal_lm(path)


def test_integer_weights_are_refused(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"].to(torch.int32)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"wpe.weight \(int32\)"):
        load_causal_lm(path)


def test_nan_weights_are_refused(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["transformer.h.0.ln_1.weight"][3] = float("nan")
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"h.0.ln_1.weight holds NaN or infinite"):
        load_causal_lm(path)


def test_symlink_loop_is_an_error_not_a_hang(gpt2, tmp_path):
    path = copy(gpt2, tmp_path)
    (path / "model.safetensors").unlink()
    os.symlink(path / "loop-b", path / "loop-a")
    os.symlink(path / "loop-a", path / "loop-b")
    os.symlink(path / "loop-a", path / "model.safetensors")
    with pytest.raises((ValueError, FileNotFoundError), match=r"model"):
        load_causal_lm(path)
    loop = tmp_path / "dir-loop"
    os.symlink(loop, loop)
    with pytest.raises(FileNotFoundError, match=r"dir-loop"):
        load_causal_lm(loop)


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickle_payload_never_runs(gpt2, tmp_path, monkeypatch):
    path = copy(gpt2, tmp_path)
    (path / "model.safetensors").unlink()
    with open(path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"wte.weight": _Payload()}, f)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"pytorch_model.bin.*corrupted or not a state dict"):
        load_causal_lm(path)
    assert not (tmp_path / "PWNED").exists()
