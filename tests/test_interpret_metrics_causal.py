"""Metrics and roles of causal patterns (and their parameters: sinks, offset scans), on
hand-built patterns with known answers."""

import math

import pytest
import torch

from multihead.interpret import metrics as M
from multihead.interpret.roles import head_roles

T = 6
TOKENS = ["<|endoftext|>", "The", " cat", " sat", ",", " ok"]


def causal_pattern(rows):
    """(1, 1, T, T) one-hot rows from per-row key indices (each <= its row)."""
    a = torch.zeros(1, 1, T, T)
    for i, j in enumerate(rows):
        assert j <= i
        a[0, 0, i, j] = 1.0
    return a


def uniform_causal():
    a = torch.tril(torch.ones(T, T))
    return (a / a.sum(-1, keepdim=True))[None, None]


def test_query_zero_is_left_out_of_causal_means():
    prev = causal_pattern([0, 0, 1, 2, 3, 4])  # query 0 can only attend to itself
    same = causal_pattern(range(T))
    a = torch.cat([prev, same], dim=1)
    assert M.previous_token(a).tolist() == [[1.0, 0.0]]
    # without `causal`, query 0's forced self-attention counts: 1/6 for the previous-token head
    assert M.same_token(a)[0].tolist() == pytest.approx([1 / T, 1.0])
    assert M.same_token(a, causal=True)[0].tolist() == [0.0, 1.0]
    share, offset = M.offset_share(a, causal=True)
    assert offset.tolist() == [[-1, 0]] and share.tolist() == [[1.0, 1.0]]
    share, _ = M.offset_share(a)
    assert share[0, 0] == pytest.approx((T - 1) / T)
    assert M.choice_rows(T, causal=True).tolist() == [False] + [True] * (T - 1)


def test_next_token_is_undefined_for_causal_patterns():
    with pytest.raises(ValueError, match="undefined"):
        M.diagonal_mass(uniform_causal(), 1, causal=True)
    out = M.head_metrics(uniform_causal(), TOKENS, causal=True, sinks=[0])
    assert "next" not in out and "next" in M.CAUSAL_UNDEFINED
    assert "next" in M.head_metrics(uniform_causal(), TOKENS)  # encoders keep it


def test_uniform_causal_entropy_is_one_when_normalised_by_what_each_query_sees():
    a = uniform_causal()
    nats, normalised = M.entropy(a, causal=True)
    assert float(normalised) == pytest.approx(1.0)
    assert float(nats) == pytest.approx(sum(math.log(i + 1) for i in range(1, T)) / (T - 1))
    _, by_log_t = M.entropy(a)  # the bidirectional normalisation undercounts a causal head
    assert float(by_log_t) < 0.7
    expected = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    assert float(M.confidence(a, causal=True)) == pytest.approx(expected)


def test_sinks_are_a_parameter():
    bos = causal_pattern([0] * T)  # every query on position 0
    last = causal_pattern([0, 1, 1, 1, 1, 1])  # every later query on position 1
    a = torch.cat([bos, last], dim=1)
    on_bos = M.head_metrics(a, TOKENS, causal=True, sinks=[0])
    on_one = M.head_metrics(a, TOKENS, causal=True, sinks=[1])
    assert on_bos["special"][0].tolist() == [1.0, 0.0]
    assert on_one["special"][0].tolist() == [0.0, 1.0]
    # confidence without the sinks: nothing is left of a pure sink head
    assert on_bos["confidence_content"][0, 0] == 0.0
    with pytest.raises(ValueError, match="sinks must be positions"):
        M.head_metrics(a, TOKENS, sinks=[T])
    # the default (no sinks given) is the bidirectional one: tokens in SPECIAL_TOKENS
    assert M.head_metrics(a, ["[CLS]", *TOKENS[1:]])["special"][0, 0] == 1.0


def test_punctuation_strips_the_leading_space_of_decoded_tokens():
    assert M.is_punctuation(" ,") and M.is_punctuation(",") and not M.is_punctuation(" cat")
    comma = causal_pattern([0, 0, 0, 0, 4, 4])
    assert M.head_metrics(comma, TOKENS, causal=True)["punctuation"][0, 0] == pytest.approx(2 / 5)


def test_previous_distance_scan_finds_a_shifted_head():
    two_back = causal_pattern([0, 0, 0, 1, 2, 3])  # query i on i-2
    prev = causal_pattern([0, 0, 1, 2, 3, 4])
    a = torch.cat([two_back, prev], dim=1)
    out = M.corpus_metrics([(a, TOKENS, [0])] * 2, causal=True, previous_distances=(1, 2, 3))
    assert out["previous"][0].tolist() == [pytest.approx(1 / 5), 1.0]
    assert out["previous_best"][0].tolist() == [1.0, 1.0]
    assert out["previous_distance"][0].tolist() == [2.0, 1.0]
    assert "previous_best" not in M.corpus_metrics([(a, TOKENS)])  # no scan asked: as before


def test_roles_say_which_offset_and_which_sinks_were_measured():
    ones = torch.ones(1, 3)
    metrics = {
        "previous": torch.tensor([[0.1, 0.9, 0.0]]),
        "previous_best": torch.tensor([[0.8, 0.9, 0.0]]),
        "previous_distance": torch.tensor([[2.0, 1.0, 1.0]]),
        "special": torch.tensor([[0.0, 0.0, 0.9]]),
        "induction": torch.tensor([[0.0, 0.0, 0.1]]),
        "induction_best": torch.tensor([[0.0, 0.0, 0.7]]),
        "induction_offset": 2 * ones,
    }
    roles = head_roles(metrics, sinks="<|endoftext|>")
    assert str(roles[0][0][0]) == "previous-token head: 0.80 of its attention on token i-2"
    assert str(roles[0][1][0]) == "previous-token head: 0.90 of its attention on token i-1"
    texts = [str(r) for r in roles[0][2]]
    assert "special-token sink head: 0.90 of its attention on <|endoftext|>" in texts
    assert (
        "induction head: 0.70 of its attention on the token at offset +2 from the earlier copy "
        "(on repeated random tokens)" in texts
    )
    # without a scan the rules fall back to the fixed-offset metrics, and say so
    plain = head_roles({"previous": metrics["previous"], "induction": 0.5 * ones})
    assert str(plain[0][1][0]) == "previous-token head: 0.90 of its attention on token i-1"
    assert "on the token after the earlier copy" in str(plain[0][0][0])
