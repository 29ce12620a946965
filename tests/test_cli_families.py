"""`multihead heads`, `multihead syntax` and `multihead.show` on each family added by issue 37
(Gemma 2, Qwen3, OLMo 2: the committed fixture directories; GPT-NeoX and Phi-3: tiny
checkpoints with tokenizers trained here): the CLI exits 0 and prints its table, show()
returns the HTML view. A smoke test over families; the numbers are checked elsewhere
(test_cli_causal.py, test_cli_inspect_syntax.py, test_interpret_families.py)."""

from __future__ import annotations

import re

import pytest

import multihead
from helpers_families import save_family
from helpers_families_core import FIXTURES
from multihead.cli import main
from multihead.interpret.syntax import shipped_corpus

FIXTURE_FAMILIES = ("gemma2", "qwen3", "olmo2")
BUILT = {"gpt_neox": "gpt_neox-parallel", "phi3": "phi3"}
TEXTS = ["The quick brown fox jumps over the lazy dog.", "When Mary and John went home, John ran."]


@pytest.fixture(scope="module", params=[*FIXTURE_FAMILIES, *BUILT])
def family_dir(request, tmp_path_factory):
    if request.param in FIXTURE_FAMILIES:
        return request.param, FIXTURES / request.param / "hf"
    directory = tmp_path_factory.mktemp(request.param) / "model"
    save_family(directory, BUILT[request.param])
    return request.param, directory


@pytest.fixture(scope="module")
def conllu(tmp_path_factory):
    """The first four sentences of the shipped CoNLL-U corpus."""
    blocks = shipped_corpus().read_text(encoding="utf-8").split("\n\n")
    sentences = [b for b in blocks if "# sent_id" in b][:4]
    path = tmp_path_factory.mktemp("corpus") / "four.conllu"
    path.write_text("\n\n".join(sentences) + "\n\n", encoding="utf-8")
    return path


def _rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"\s*L\d+ H\d+\b", line)]


def test_heads(family_dir, tmp_path, capsys):
    _, directory = family_dir
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    assert main(["heads", "--corpus", str(corpus), "--model", str(directory), "--top", "4"]) == 0
    out = capsys.readouterr().out
    assert f"{directory} (causal LM) over 2 texts" in out.splitlines()[0]
    assert out.splitlines()[2].split()[:2] == ["head", "role"]
    assert len(_rows(out)) == 4


def test_syntax(family_dir, conllu, capsys):
    _, directory = family_dir
    args = ["syntax", str(conllu), "--model", str(directory), "--min-count", "1"]
    code = main(args)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    config = multihead.load(str(directory)).config
    head = f"{config.num_layers} layers x {config.num_heads} heads, 4 sentences"
    assert head in printed.out.splitlines()[0]
    header = next(line for line in printed.out.splitlines() if line.startswith("relation"))
    assert header.split()[:4] == ["relation", "direction", "pairs", "best"]
    assert re.search(r"^det\s+head->dependent\s+\d+\s+L\d+ H\d+", printed.out, re.M)


def test_show(family_dir):
    _, directory = family_dir
    model = multihead.load(str(directory))
    view = multihead.show(model, TEXTS[0], probe=False)
    c = model.config
    assert (view.data["L"], view.data["H"], view.data["causal"]) == (
        c.num_layers,
        c.num_heads,
        True,
    )
    assert "".join(view.data["tokens"]).endswith("lazy dog.")
    html = view._repr_html_()
    assert html.startswith("<style>") and html.rstrip().endswith("</script>")
