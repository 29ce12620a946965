"""`multihead inspect` and `heads` on every encoder family the loaders read, with random models
whose position tables are short (the random-token probe must shrink to fit them)."""

import pytest

from helpers_encoders import KINDS, save_encoder
from multihead.cli import main
from multihead.interpret.analysis import analyze, probe_length
from multihead.interpret.subject import load_subject

TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    dirs = {}
    for kind in KINDS:
        save_encoder(root / kind, kind)
        dirs[kind] = root / kind
    return dirs


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_inspect_and_heads_read_every_encoder_family(model_dirs, kind, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["inspect", TEXT, "--model", str(model_dirs[kind]), "-o", str(out)]) == 0
    assert out.stat().st_size > 0
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{TEXT}\nA second, shorter line.\n", encoding="utf-8")
    assert main(["heads", "--corpus", str(corpus), "--model", str(model_dirs[kind])]) == 0
    assert "over 2 texts" in capsys.readouterr().out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_probe_fits_the_position_table(model_dirs, kind):
    subject = load_subject(model_dirs[kind])
    length = probe_length(subject)
    assert 2 <= length <= 16
    assert len(subject.prefix) + 3 * length + len(subject.suffix) <= subject.max_positions
    analysis = analyze(subject, [TEXT])
    assert analysis.probe is not None and analysis.probe.length == length
    assert analysis.metrics["induction"].shape == (subject.num_layers, subject.num_heads)
