"""`multihead syntax`: the table, the JSON contract, the HTML page and every bad input as one
`multihead: error:` line (random GPT-2 weights: byte-level BPE, causal)."""

import itertools
import json
import re

import pytest

from helpers_gpt2 import save_gpt2
from multihead.cli import main

pytest.importorskip("transformers")

CONLLU = """# sent_id = s1
1\tThe\t_\tDET\t_\t_\t2\tdet\t_\t_
2\tdog\t_\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tsleeps\t_\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
4\t.\t_\tPUNCT\t_\t_\t3\tpunct\t_\t_

"""


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    save_gpt2(path, n_layer=2, n_head=3, n_embd=24, n_positions=40, scale=3.0)
    return path


def test_the_shipped_corpus_table_and_json_contract(gpt2, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["syntax", "--model", str(gpt2), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{gpt2}: 2 layers x 3 heads, ")
    assert "skipped" in printed and "longer than the model's 40 tokens" in printed
    assert "causal: dependent->head scores " in printed and "causal: head->dependent" in printed
    assert re.search(r"\nrelation\s+direction\s+pairs\s+best\s+acc\s+95% CI\s+offset", printed)
    data = json.loads(out.read_text())
    assert list(data) == ["model", "sentences", "words", "relations", "per_head"]
    assert (
        data["model"] == str(gpt2) and data["sentences"] > 0 and data["words"] > data["sentences"]
    )
    keys = [
        "relation",
        "direction",
        "count",
        "layer",
        "head",
        "accuracy",
        "ci",
        "baseline_offset",
        "baseline_accuracy",
    ]
    margins = []
    for r in data["relations"]:
        assert list(r) == keys
        assert r["count"] >= 10 and 0 <= r["layer"] < 2 and 0 <= r["head"] < 3
        grid = data["per_head"][r["relation"]][r["direction"]]
        assert len(grid) == 2 and all(len(row) == 3 for row in grid)
        assert grid[r["layer"]][r["head"]] == r["accuracy"] == max(max(row) for row in grid)
        lo, hi = r["ci"]
        assert lo <= r["accuracy"] <= hi
        margins.append(r["accuracy"] - r["baseline_accuracy"])
    assert margins and all(a >= b - 1e-5 for a, b in itertools.pairwise(margins))  # rounded


def test_html_draws_the_chosen_relation(gpt2, tmp_path, capsys):
    path = tmp_path / "c.conllu"
    path.write_text(CONLLU * 3)
    out = tmp_path / "s.html"
    args = ["syntax", str(path), "--model", str(gpt2), "--min-count", "3", "-o", str(out)]
    assert main([*args, "--show", "det"]) == 0
    page = out.read_text()
    assert (
        page.count("<svg") == 3 and "<h2>det (head-&gt;dependent): L" in page
    )  # causal: no heads after
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")
    assert main([*args, "--show", "obj"]) == 2
    assert (
        "--show 'obj' is not a scored relation; scored: ['det', 'nsubj']" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ("1\tThe\t_\t_\t_\t_\t0\troot\t_\n", [], r"line 1: 9 tab-separated columns"),
        (
            CONLLU.replace("\t3\tnsubj", "\t9\tnsubj"),
            [],
            r"c.conllu, sentence at line 1, line 3: word 2 'dog' has head 9, out of range 0..4",
        ),
        (
            "The dog sleeps.\n",
            [],
            r"holds no CoNLL-U token lines; for plain text give --parser NAME",
        ),
        (
            CONLLU,
            ["--relations", "obj"],
            r"--relations: relation 'obj' is not a label of the corpus; it has det nsubj punct root",
        ),
        ("# only a comment\n", [], r"holds no CoNLL-U token lines"),
        (
            "The dog sleeps.\n",
            ["--parser", "xx_none"],
            r"(no spaCy pipeline named 'xx_none'|needs spaCy)",
        ),
    ],
)
def test_bad_input_is_one_error_line(gpt2, tmp_path, capsys, text, extra, message):
    path = tmp_path / "c.conllu"
    path.write_text(text)
    assert main(["syntax", str(path), "--model", str(gpt2), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("multihead: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_min_count_leaves_out_rare_relations(gpt2, tmp_path, capsys):
    path = tmp_path / "c.conllu"
    path.write_text(CONLLU)
    assert main(["syntax", str(path), "--model", str(gpt2)]) == 0
    assert "no relation has 10 scored pairs (--min-count)" in capsys.readouterr().out
