"""Hostile GGUF files (issue 40): tensor infos checked as safetensors headers are (one name
each, inside the data section, no two tensors on the same bytes), special-token ids inside the
vocabulary, metadata arrays checked against the bytes left before anything is unpacked and
nested at most a few levels, tokenizer data `tokenizers` refuses named by file and key. Each
is one ValueError naming the file (one `multihead: error:` line on the command line)."""

from __future__ import annotations

import struct
import tracemalloc

import gguf
import pytest

from helpers_gguf import VOCAB, write_gguf
from multihead.cli import main
from multihead.models import load_causal_lm
from multihead.models.gguf import GGUFError, GGUFFile


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "F32")
    return path


def refused(path, *fragments):
    with pytest.raises(ValueError) as e:
        load_causal_lm(path)
    message = str(e.value)
    assert repr(str(path)) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _info_at(data: bytes, name: str) -> tuple[int, int]:
    """Where tensor `name`'s info starts (its name's length) and where its offset field lies."""
    raw = name.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw)
    pos = at + 8 + len(raw)
    (n_dims,) = struct.unpack_from("<I", data, pos)
    return at, pos + 4 + 8 * n_dims + 4


def _offset(data: bytes, name: str) -> int:
    return struct.unpack_from("<Q", data, _info_at(data, name)[1])[0]


def _add_info(path, copy_of: str, name: str) -> None:
    """A second tensor info for `copy_of`'s bytes, named `name`, after the last one (the data
    section moved to the next aligned byte, the offsets unchanged)."""
    data = path.read_bytes()
    last = gguf.GGUFReader(path).tensors[-1].name
    end = _info_at(data, last)[1] + 8  # the header ends after the last info's offset
    start = end + (-end % 32)
    at, field = _info_at(data, copy_of)
    info = struct.pack("<Q", len(name)) + name.encode() + data[at + 8 + len(copy_of) : field + 8]
    header = bytearray(data[:end] + info)
    header[8:16] = struct.pack("<Q", struct.unpack_from("<Q", data, 8)[0] + 1)
    header += bytes(-len(header) % 32)
    path.write_bytes(bytes(header) + data[start:])


def test_two_tensor_infos_with_one_name_are_refused(good):
    # a second info named blk.0.attn_q.weight over layer 1's queries: the last one used to win
    _add_info(good, "blk.1.attn_q.weight", "blk.0.attn_q.weight")
    refused(good, "'blk.0.attn_q.weight'", "twice")


def test_two_tensors_on_one_byte_range_are_refused(good):
    data = bytearray(good.read_bytes())
    k_offset = _offset(bytes(data), "blk.0.attn_k.weight")
    _, field = _info_at(bytes(data), "blk.0.attn_v.weight")
    data[field : field + 8] = struct.pack("<Q", k_offset)  # v reads k's bytes (k = v)
    good.write_bytes(bytes(data))
    refused(good, "overlap", "blk.0.attn_k.weight", "blk.0.attn_v.weight")


def test_tensor_offset_not_aligned_is_refused(good):
    data = bytearray(good.read_bytes())
    _, field = _info_at(bytes(data), "output_norm.weight")
    offset = _offset(bytes(data), "output_norm.weight")
    data[field : field + 8] = struct.pack("<Q", offset + 4)
    good.write_bytes(bytes(data))
    refused(good, "'output_norm.weight'", "alignment")


def test_tensor_past_the_data_section_is_refused(good):
    data = bytearray(good.read_bytes())
    _, field = _info_at(bytes(data), "output_norm.weight")
    data[field : field + 8] = struct.pack("<Q", 2**62)  # offset + size would wrap nothing
    good.write_bytes(bytes(data))
    refused(good, "'output_norm.weight'", "needs bytes")


def _with_tokenizer_edit(tmp_path, edit):
    path = tmp_path / "t.gguf"
    write_gguf(path, "llama", "F32", edit=edit)
    return path


@pytest.mark.parametrize(
    "key", ["bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id"]
)
def test_special_token_id_outside_the_vocabulary_is_refused(tmp_path, key):
    def far(writer, tensors):
        if key in ("bos_token_id", "eos_token_id"):  # replace the helper's ids
            writer.kv_data[0].pop(f"tokenizer.ggml.{key}")
        writer.add_uint32(f"tokenizer.ggml.{key}", 10**9)

    path = _with_tokenizer_edit(tmp_path, far)
    refused(path, f"tokenizer.ggml.{key}", "1000000000", f"{VOCAB} tokens")


def test_merges_tokenizers_refuses_name_the_key(tmp_path):
    def bad_merge(writer, tensors):
        writer.kv_data[0].pop("tokenizer.ggml.merges")
        writer.add_token_merges(["a b", "zz qq"])  # tokens not in the vocabulary

    path = _with_tokenizer_edit(tmp_path, bad_merge)
    refused(path, "tokenizer.ggml.merges", "zz")


def test_merge_without_a_space_names_the_key(tmp_path):
    def bad_merge(writer, tensors):
        writer.kv_data[0].pop("tokenizer.ggml.merges")
        writer.add_token_merges(["a b", "abc"])

    path = _with_tokenizer_edit(tmp_path, bad_merge)
    refused(path, "tokenizer.ggml.merges", "'abc'")


def test_corrupt_tokenizer_is_one_cli_line(tmp_path, capsys):
    def bad_merge(writer, tensors):
        writer.kv_data[0].pop("tokenizer.ggml.merges")
        writer.add_token_merges(["zz qq"])

    path = _with_tokenizer_edit(tmp_path, bad_merge)
    assert main(["inspect", "some text", "--model", str(path), "-o", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: "), err
    assert "tokenizer.ggml.merges" in err[0]


def _raw_gguf(path, kv: bytes, n_kv: int = 1) -> None:
    """A GGUF file with no tensors and `n_kv` metadata entries written as `kv`."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + kv)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


ARRAY, STRING, UINT8 = 9, 8, 0


def test_array_nested_5000_deep_is_refused_without_recursion(tmp_path):
    path = tmp_path / "deep.gguf"
    depth = 5000
    kv = _key("general.deep") + struct.pack("<I", ARRAY)
    kv += struct.pack("<IQ", ARRAY, 1) * depth + struct.pack("<IQ", UINT8, 0)
    _raw_gguf(path, kv)
    with pytest.raises(GGUFError, match="nested"):
        GGUFFile(path)


def test_array_claiming_more_strings_than_bytes_left_is_refused_before_unpacking(tmp_path):
    path = tmp_path / "big.gguf"
    # (the finding: 90 M items in a 98 MB file took 1.9 GB before failing; scaled down)
    # 2 million strings need at least 16 MB of length fields; the file holds 4 MB of zeros,
    # which used to be unpacked as 500,000 empty strings before the reader noticed
    kv = _key("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 2_000_000)
    _raw_gguf(path, kv + bytes(4 * 2**20))
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match="2000000 items"):
            GGUFFile(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.0f} MB unpacked before refusing"


def test_array_of_more_items_than_any_vocabulary_is_refused(tmp_path):
    path = tmp_path / "huge.gguf"
    count = 2**24 + 1  # bytes enough, but no GGUF needs 16 M items in one array
    kv = _key("general.huge") + struct.pack("<IIQ", ARRAY, UINT8, count) + bytes(count)
    _raw_gguf(path, kv)
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match=f"{count} items"):
            GGUFFile(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.0f} MB unpacked before refusing"


def test_a_good_file_still_loads_with_its_special_tokens(good):
    model = load_causal_lm(good)
    assert model.tokenizer.bos_id == VOCAB - 1 and model.tokenizer.eos_id == VOCAB - 1
