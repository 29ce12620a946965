"""Bad GGUF input: each one ValueError naming the file and what was expected (no gguf
traceback), and on the command line one `multihead: error:` line, exit code 2, nothing
written."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from helpers_gguf import write_gguf
from multihead.cli import main
from multihead.models import load_causal_lm


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q4_1")
    return path


def refused(path, *fragments):
    with pytest.raises(ValueError) as e:
        load_causal_lm(path)
    for fragment in fragments:
        assert fragment in str(e.value), str(e.value)
    return str(e.value)


def test_truncated_in_the_data(good):
    data = good.read_bytes()
    good.write_bytes(data[: len(data) - 100])
    refused(good, repr(str(good)), "truncated: tensor", "needs bytes")


def test_truncated_in_the_header(good):
    good.write_bytes(good.read_bytes()[:200])
    refused(good, repr(str(good)), "truncated")


def test_corrupt_string_length(good):
    data = bytearray(good.read_bytes())
    data[24:32] = (2**40).to_bytes(8, "little")  # the first metadata key's length
    good.write_bytes(bytes(data))
    refused(good, "is not a readable GGUF file", "truncated")


def test_newer_format_version(good):
    data = bytearray(good.read_bytes())
    data[4:8] = (4).to_bytes(4, "little")
    good.write_bytes(bytes(data))
    refused(good, "GGUF version 4 (a newer format than this reader knows)", "versions 2, 3")


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "f.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    refused(
        path,
        "unsupported architecture 'falcon'",
        "'llama', 'mistral', 'qwen2', 'phi3', 'gpt2', 'gptneox'",
    )


def test_quantisation_type_gguf_cannot_dequantise_is_named(tmp_path):
    def q8_1(writer, tensors):
        blocks = np.zeros((96, 2 * 40), np.uint8)  # 96 rows of 64 values in Q8_1 blocks
        tensors.pop("blk.0.ffn_up.weight")
        writer.add_tensor("blk.0.ffn_up.weight", blocks, raw_dtype=Q.Q8_1)

    path = tmp_path / "q.gguf"
    write_gguf(path, "llama", "F32", edit=q8_1)
    refused(path, "'blk.0.ffn_up.weight' is stored as Q8_1", "cannot dequantise")


def test_integer_tensor_is_not_a_weight(tmp_path):
    def ints(writer, tensors):
        tensors.pop("output_norm.weight")
        writer.add_tensor("output_norm.weight", np.zeros(64, np.int32))

    path = tmp_path / "i.gguf"
    write_gguf(path, "llama", "F32", edit=ints)
    refused(path, "'output_norm.weight' is stored as I32", "not as weights")


def test_metadata_contradicting_a_tensor_shape(tmp_path):
    def narrow(writer, tensors):
        tensors["blk.1.ffn_up.weight"] = tensors["blk.1.ffn_up.weight"][:64]

    path = tmp_path / "s.gguf"
    write_gguf(path, "llama", "Q8_0", edit=narrow)
    message = refused(path, repr(str(path)))
    # refused before any weight is read, naming the tensor, its shape and the metadata
    assert re.search(
        r"GGUF metadata contradicts tensor blk\.1\.ffn_up\.weight of shape \(64, 64\): "
        r"llama\.feed_forward_length = 96, llama\.embedding_length = 64 expect shape \(96, 64\)",
        message,
    )


def test_metadata_asking_for_more_layers_than_the_file_has(tmp_path):
    def drop(writer, tensors):
        for name in [n for n in tensors if n.startswith("blk.1.")]:
            tensors.pop(name)

    path = tmp_path / "l.gguf"
    write_gguf(path, "llama", "F32", edit=drop)
    refused(path, "layers.1")


def test_sentencepiece_tokenizer_without_scores_and_unknown_models_are_refused_by_name(tmp_path):
    path = tmp_path / "t.gguf"
    write_gguf(path, "llama", "F32", tokenizer="llama")  # no tokenizer.ggml.scores
    refused(path, "tokenizer.ggml.scores must list one value per token (96), got None")
    write_gguf(path, "llama", "F32", tokenizer="t5")
    refused(path, "tokenizer.ggml.model 't5' is not supported", "SentencePiece ('llama')")


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda data: data[: len(data) - 100], "truncated: tensor"),
        (lambda data: data[:4] + (4).to_bytes(4, "little") + data[8:], "GGUF version 4"),
    ],
)
def test_cli_one_line_exit_2_nothing_written(good, tmp_path, capsys, damage, fragment):
    good.write_bytes(damage(good.read_bytes()))
    out = tmp_path / "out"
    out.mkdir()
    assert main(["inspect", "some text", "--model", str(good), "-o", str(out / "r.html")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"multihead: error: model {str(good)!r}")
    assert fragment in err[0] and "Traceback" not in err[0]
    assert list(out.iterdir()) == []
