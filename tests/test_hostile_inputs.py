"""Inputs are bounded before they are read: an endless or huge input (/dev/zero, a stdin that
never ends, a file over the limit) is one `multihead: error:` line at once, having read at most
the limit; a TEXT argument that is not UTF-8 gets the file readers' one-line error; an empty
sentence is refused by `similarity` as by `embed`."""

import io
import os

import pytest

from multihead.cli import main
from multihead.cli.errors import UsageError
from multihead.cli.inputs import LIMIT_VARIABLE, input_limit, read_stdin, read_text_file


def one_error(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: "), err
    for fragment in fragments:
        assert fragment in err[0], err[0]
    return err[0]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize(
    "argv",
    [["heads", "--corpus", "/dev/zero"], ["embed", "--file", "/dev/zero"]],
)
def test_dev_zero_is_refused_at_once(capsys, argv):
    one_error(capsys, argv, "/dev/zero", "NUL bytes")


class EndlessText:
    """A stdin whose bytes never end (text, so the NUL check cannot stop it); counts reads."""

    def __init__(self):
        self.read_bytes = 0
        self.buffer = self

    def read(self, n=-1):
        assert n is not None and n >= 0, "an unbounded read of an endless stream"
        self.read_bytes += n
        return b"a" * n

    def isatty(self):
        return False


def test_endless_stdin_stops_at_the_limit(monkeypatch, capsys):
    monkeypatch.setenv(LIMIT_VARIABLE, "100000")
    stdin = EndlessText()
    monkeypatch.setattr("sys.stdin", stdin)
    one_error(capsys, ["inspect", "-"], "stdin", "100000-byte limit", LIMIT_VARIABLE)
    assert stdin.read_bytes <= 100000 + 65536
    stdin = EndlessText()
    monkeypatch.setattr("sys.stdin", stdin)
    one_error(capsys, ["embed"], "stdin", "100000-byte limit")


def test_file_over_the_limit_is_refused_and_at_the_limit_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(LIMIT_VARIABLE, "100")
    at_limit, over = tmp_path / "at.txt", tmp_path / "over.txt"
    at_limit.write_text("x" * 99 + "\n")
    over.write_text("x" * 100 + "\n")
    assert read_text_file(at_limit, "--corpus") == "x" * 99 + "\n"
    with pytest.raises(UsageError, match=r"--corpus '.*over.txt' is larger than the 100-byte"):
        read_text_file(over, "--corpus")
    one_error(capsys, ["heads", "--corpus", str(over)], "over.txt", "100-byte limit")


def test_limit_default_and_bad_override(monkeypatch):
    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    assert input_limit() == 64 * 2**20
    monkeypatch.setenv(LIMIT_VARIABLE, "lots")
    with pytest.raises(UsageError, match=rf"{LIMIT_VARIABLE} must be a positive number of bytes"):
        input_limit()


def test_text_stream_without_bytes_is_bounded(monkeypatch):
    monkeypatch.setenv(LIMIT_VARIABLE, "10")
    assert read_stdin(io.StringIO("short\n")) == "short\n"
    with pytest.raises(UsageError, match="stdin is larger than the 10-byte limit"):
        read_stdin(io.StringIO("x" * 11))


NOT_UTF8 = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # what Python makes of argv


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["inspect", NOT_UTF8], "TEXT"),
        (["embed", "fine", NOT_UTF8], "sentence 2"),
        (["similarity", NOT_UTF8, "a cat"], "A"),
        (["similarity", "a cat", NOT_UTF8], "B"),
    ],
)
def test_non_utf8_text_argument_is_the_file_readers_error(capsys, argv, what):
    one_error(capsys, argv, f"{what} is not UTF-8 text: byte 0xe9", "cannot be decoded")


@pytest.mark.parametrize(("a", "b", "what"), [("", "a cat", "A"), ("a cat", "  ", "B")])
def test_similarity_refuses_an_empty_sentence(capsys, a, b, what):
    one_error(capsys, ["similarity", a, b], f"{what} is empty")


# Issue 40: a named pipe nobody writes to, and text that is not text (lone surrogates).
def _fifo(tmp_path, name):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _in_a_child(argv, timeout=120):
    """The command in a subprocess, so a hang is a failed test rather than a stuck suite."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "multihead.cli", *argv], capture_output=True, timeout=timeout,
        text=True,
    )  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_named_pipe_without_writer_as_corpus_is_refused_without_blocking(tmp_path):
    fifo = _fifo(tmp_path, "corpus")
    done = _in_a_child(["heads", "--corpus", str(fifo)])
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: --corpus"), err
    assert "named pipe" in err[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_named_pipe_without_writer_as_model_is_refused_without_blocking(tmp_path):
    fifo = _fifo(tmp_path, "model.gguf")
    done = _in_a_child(["inspect", "a text", "--model", str(fifo)])
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("multihead: error: model "), err
    assert "not a regular file" in err[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_with_a_writer_is_still_read(tmp_path):
    fifo = _fifo(tmp_path, "text")
    keeper = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # holds the pipe open meanwhile
    try:
        writer = os.open(fifo, os.O_WRONLY)  # a reader exists: does not wait
        os.write(writer, b"one line\n")
        os.close(writer)  # (as `<(command)` does when it ends)
        assert read_text_file(fifo, "--file") == "one line\n"
    finally:
        os.close(keeper)


def test_lone_surrogate_text_argument_is_refused_by_name(capsys):
    one_error(capsys, ["inspect", "bad \ud800"], "TEXT", "'\\ud800'", "lone surrogate")


def test_lone_surrogate_in_library_calls_is_refused_by_name():
    from tokenizers import Tokenizer, models, pre_tokenizers

    import multihead
    from multihead.interpret.head_view import show
    from multihead.models.text import ModelTokenizer

    encoder = multihead.load()
    with pytest.raises(ValueError, match=r"text holds '\\ud800' at index 4, a lone surrogate"):
        show(encoder, "bad \ud800")
    with pytest.raises(ValueError, match=r"texts\[1\] holds '\\udfff' at index 0"):
        encoder.encode(["fine", "\udfff"])
    raw = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = ModelTokenizer(raw)
    with pytest.raises(ValueError, match=r"text holds '\\ud800'"):
        tok.encode("a \ud800")
    assert tok.encode("a") == [0]
