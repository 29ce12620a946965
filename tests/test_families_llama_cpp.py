"""GPT-NeoX (parallel and sequential residual), Phi-3 (longrope, partial rotary, fused
projections), Llama 3.x (llama3 RoPE; byte-level BPE tokenizer) and Llama with a SentencePiece
tokenizer: tiny random checkpoints saved by transformers, loaded by multihead from the
directory, the Hugging Face cache and the GGUF files llama.cpp's own converter writes from them
(f32 and q8_0), against transformers' eager fp32 run of the directory; tokenizer ids from the
GGUF against AutoTokenizer of the directory and against SentencePiece itself."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from helpers_families import CHECK_TEXTS, FAMILIES, convert, save_family
from multihead.cli import main
from multihead.interpret import run_with_cache
from multihead.models import load_causal_lm
from multihead.modules import CausalLM

transformers = pytest.importorskip("transformers")

NAMES = list(FAMILIES)
T = 40  # past original_max_position_embeddings (16): the scaled frequencies matter


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """name -> (directory, transformers model, eager attention)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name in NAMES:
        hf = save_family(root / name, name)
        hf.config._attn_implementation = "eager"  # output_attentions, the textbook reference
        out[name] = (root / name, hf)
    return out


@pytest.fixture(scope="module")
def ggufs(dirs, tmp_path_factory):
    """(name, outtype) -> the GGUF llama.cpp's converter wrote (one process for all)."""
    work = tmp_path_factory.mktemp("converted")
    jobs, paths = [], {}
    for name, (path, _) in dirs.items():
        for outtype in ("f32", "q8_0"):
            paths[name, outtype] = work / f"{name}.{outtype}.gguf"
            jobs.append({"model": str(path), "outfile": str(paths[name, outtype]),
                         "outtype": outtype, "pre": FAMILIES[name][3]})  # fmt: skip
    convert(jobs, work)
    return paths


def ids_for(hf) -> torch.Tensor:
    torch.manual_seed(5)
    return torch.randint(0, hf.config.vocab_size, (2, T))


def reference(hf, ids):
    with torch.no_grad():
        return hf(ids, output_attentions=True)


@pytest.mark.parametrize("name", NAMES)
def test_directory_logits_and_patterns_equal_transformers(dirs, name):
    path, hf = dirs[name]
    ours = load_causal_lm(path)
    ids = ids_for(hf)
    ref = reference(hf, ids)
    with torch.no_grad():
        logits, cache = run_with_cache(ours, ids, names=lambda n: n.endswith("hook_pattern"))
    assert float((logits - ref.logits).abs().max()) <= 1e-4
    for layer, pattern in enumerate(ref.attentions):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], pattern,
                                   atol=1e-5, rtol=0)  # fmt: skip
    # the family's mechanisms are not no-ops: switching each off changes the logits
    c = ours.config
    changes = [{"rope_scaling": None}] if c.rope_scaling is not None else []
    if c.rotary_dim is not None and c.rotary_dim < c.dim // c.num_heads:
        changes.append({"rotary_dim": None, "rope_scaling": None})  # (its factors fit the part)
    if "gpt_neox" in name:
        changes.append({"parallel_residual": not c.parallel_residual})
    assert changes or name == "llama-spm"
    for change in changes:
        plain = CausalLM(dataclasses.replace(c, **change)).eval()
        plain.load_state_dict(ours.state_dict())
        with torch.no_grad():
            assert float((plain(ids) - ref.logits).abs().max()) > 1e-2, change


@pytest.mark.parametrize("name", NAMES)
def test_gguf_from_llama_cpp_equals_transformers(dirs, ggufs, name):
    path, hf = dirs[name]
    ids = ids_for(hf)
    ref = reference(hf, ids).logits
    f32 = load_causal_lm(ggufs[name, "f32"])
    with torch.no_grad():
        assert float((f32(ids) - ref).abs().max()) <= 1e-4
        q8 = load_causal_lm(ggufs[name, "q8_0"])(ids)
    # q8_0: 8-bit blocks of 32 with a scale each; a few hundredths on logits of a few units
    error = float((q8 - ref).abs().max())
    assert 0 < error <= 0.1 * float(ref.abs().max())
    # same argmax wherever transformers' top two are further apart than twice the error
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * error
    assert clear.float().mean() > 0.5
    assert torch.equal(q8.argmax(-1)[clear], ref.argmax(-1)[clear])
    # the same model: llama.cpp stores Llama 3.1's factors as rope_freqs divisors and Phi-3's
    # attention factor explicitly; the frequencies and factors they give are the same
    a, b = load_causal_lm(ggufs[name, "f32"]), load_causal_lm(path)
    plain = {"rope_scaling": None, "norm_eps": 0.0}  # the file stores epsilons as float32
    assert dataclasses.replace(a.config, **plain) == dataclasses.replace(b.config, **plain)
    assert a.config.norm_eps == pytest.approx(b.config.norm_eps, rel=1e-6)
    ra, rb = a.attention(0).position, b.attention(0).position
    torch.testing.assert_close(ra.inv_freq, rb.inv_freq, atol=0, rtol=1e-6)
    if rb.long_inv_freq is not None:
        torch.testing.assert_close(ra.long_inv_freq, rb.long_inv_freq, atol=0, rtol=1e-6)
    assert ra.attention_scale == pytest.approx(rb.attention_scale, rel=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_gguf_tokenizer_ids_equal_the_directory_tokenizer(dirs, ggufs, name):
    path, _ = dirs[name]
    ours = load_causal_lm(ggufs[name, "q8_0"]).tokenizer
    auto = transformers.AutoTokenizer.from_pretrained(path)
    assert ours is not None
    spm = FAMILIES[name][2] == "spm"
    if spm:
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=str(path / "tokenizer.model"))
    for text in CHECK_TEXTS:
        got = ours.tokenizer.encode(text, add_special_tokens=False).ids
        want = auto(text, add_special_tokens=False)["input_ids"]
        if spm:
            assert got == processor.encode(text), text
            if text[:1].isspace():  # transformers 5 adds no dummy prefix before a space
                continue
        assert got == want, text
    # control tokens stay whole, as in transformers (llama.cpp's converter writes the
    # SentencePiece user-defined "<user>" as a normal token: llama.cpp splits it too); after a
    # control token SentencePiece text gets the dummy prefix again, as in llama.cpp
    special = "<ctrl>" if spm else auto.eos_token
    text = f"a {special} c"
    got = ours.tokenizer.encode(text, add_special_tokens=False).ids
    assert got.count(auto.convert_tokens_to_ids(special)) == 1
    if not spm:
        assert got == auto(text, add_special_tokens=False)["input_ids"]
    assert ours.add_bos == spm and (not spm or ours.bos_id == auto.bos_token_id)


@pytest.mark.parametrize("name", ["gpt_neox-parallel", "phi3"])
def test_hf_cache_and_inspect(dirs, name, tmp_path, monkeypatch, capsys):
    path, hf = dirs[name]
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hub" / "models--org--tiny"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(path, root / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids = ids_for(hf)
    with torch.no_grad():
        got = load_causal_lm("org/tiny")(ids)
        assert float((got - reference(hf, ids).logits).abs().max()) <= 1e-4
    out = tmp_path / "report.json"
    assert main(["inspect", "the quick brown fox", "--model", "org/tiny", "-o", str(out)]) == 0
    assert out.stat().st_size > 100
