"""`multihead bench decode --model DIR`: the directory is checked before anything is loaded
(a decoder model_type, weights readable, shards present, prompt + new within its positions),
then benchmarked; the table's columns name the positions actually timed."""

import json

import pytest

from multihead.cli import main

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import torch
    import transformers

    from helpers_encoders import save_encoder

    root = tmp_path_factory.mktemp("decoders")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=60, n_embd=24, n_layer=2, n_head=3, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg)
    model.save_pretrained(root / "gpt2")  # no tokenizer: the prompts are random ids
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    save_encoder(root / "mpnet", "mpnet")
    return root


@pytest.fixture
def recorded(monkeypatch):
    """bench.decode.run replaced by a recorder: what the command would have benchmarked."""
    calls = []
    monkeypatch.setattr(
        "multihead.bench.decode.run", lambda **kwargs: calls.append(kwargs) or "table"
    )
    return calls


def fails(capsys, argv, fragment):
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: "), err
    assert fragment in err[0]


def test_the_directory_is_checked_first(models, tmp_path, capsys, recorded):
    bench = ["bench", "decode", "--model"]
    fails(capsys, [*bench, str(models / "mpnet")], "reads decoders (model_type 'gpt2', 'llama'")
    fails(capsys, [*bench, str(models / "mpnet")], "config.json says model_type 'mpnet'")
    fails(
        capsys,
        [*bench, str(models / "gpt2"), "--prompt", "30", "--new", "3"],
        "--prompt + --new is 33, more than the model's 32 positions",
    )
    fails(capsys, [*bench, str(tmp_path / "none")], "no such directory")
    (tmp_path / "empty").mkdir()
    fails(capsys, [*bench, str(tmp_path / "empty")], "lacks config.json, model.safetensors")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((models / "sharded" / "config.json").read_text())
    index = json.loads((models / "sharded" / "model.safetensors.index.json").read_text())
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    fails(capsys, [*bench, str(broken)], "model.safetensors.index.json names shards that are")
    assert recorded == []  # nothing ran


def test_a_checkpoint_directory_is_benchmarked(models, capsys, recorded):
    for name in ("gpt2", "sharded"):
        argv = ["bench", "decode", "--model", str(models / name), "--batches", "1"]
        assert main([*argv, "--prompt", "5", "--new", "3", "--repeats", "1"]) == 0
        assert recorded[-1] == dict(
            batches=[1],
            prompt_len=5,
            new=3,
            repeats=1,
            model_dir=str(models / name),
            device="cpu",
            dtype="fp32",
            compile=True,
            hf_static=True,
            hf_compile=None,
        )
    assert main(["bench", "decode", "--new", "4"]) == 0  # the default: random GPT-2 weights
    assert recorded[-1]["model_dir"] is None
    flags = ["--no-compile", "--no-hf-static", "--hf-compile", "--dtype", "bf16"]
    assert main(["bench", "decode", "--new", "4", *flags]) == 0
    assert {k: recorded[-1][k] for k in ("compile", "hf_static", "hf_compile", "dtype")} == dict(
        compile=False, hf_static=False, hf_compile=True, dtype="bf16"
    )


def test_columns_name_the_positions_timed(models, monkeypatch, capsys):
    from multihead.bench import decode

    monkeypatch.setattr(decode, "read_bandwidth", lambda device: 1e10)  # not this test's concern
    text = decode.run(
        batches=[1],
        prompt_len=5,
        new=3,
        repeats=1,
        model_dir=str(models / "gpt2"),
        compile=False,  # compiling takes a minute; tests/test_generation_inductor.py runs it
    )
    header = next(line for line in text.splitlines() if line.startswith("batch "))
    for label in ("ms/step @5", "ms/step @8", "@8/@5", "recompute ms @5/@8"):
        assert label in header
    assert "128" not in header and "384" not in header
    assert "the cached step at position 8" in text
    assert str(models / "gpt2") in text.splitlines()[0]


def test_the_cli_knows_every_decoder_type_the_loader_reads():
    from multihead.cli.model_dir import CAUSAL_LM_TYPES
    from multihead.models import CAUSAL_LM_FAMILIES

    assert set(CAUSAL_LM_TYPES) == set(CAUSAL_LM_FAMILIES)


def test_gguf_flags_without_gguf_or_together_are_refused(capsys, recorded):
    """--prefill-only and --gguf-compiled belong to the quantized bench: without --gguf they
    would go unread (the random GPT-2 bench running instead), and together they contradict
    each other (no decoding vs compiled decoders)."""
    fails(capsys, ["bench", "decode", "--prefill-only"], "--prefill-only is for the quantized")
    fails(capsys, ["bench", "decode", "--gguf-compiled"], "--gguf-compiled is for the quantized")
    fails(
        capsys,
        ["bench", "decode", "--gguf", "--prefill-only", "--gguf-compiled"],
        "--prefill-only times no decoding and --gguf-compiled adds compiled decoders",
    )
    assert recorded == []
