"""Head metrics on hand-built attention patterns with known answers."""

import math

import pytest
import torch

from multihead.interpret import metrics as M
from multihead.interpret.roles import head_roles, strongest

TOKENS = ["[CLS]", "the", "cat", ",", "sat", ".", "[SEP]"]
T = len(TOKENS)


def pattern(rows):
    """(1, 1, T, T) from a per-row list of key indices (one-hot rows)."""
    a = torch.zeros(1, 1, T, T)
    for i, j in enumerate(rows):
        a[0, 0, i, j] = 1.0
    return a


def stack(*heads):
    return torch.cat(heads, dim=1)  # (1, H, T, T)


def test_previous_next_self_and_positional():
    prev = pattern([0, *list(range(T - 1))])  # row 0 has no previous token: itself
    nxt = pattern([*list(range(1, T)), T - 1])
    same = pattern(range(T))
    a = stack(prev, nxt, same)
    assert M.previous_token(a).tolist() == [[1.0, 0.0, 0.0]]
    assert M.next_token(a).tolist() == [[0.0, 1.0, 0.0]]
    assert M.same_token(a)[0, 2] == 1.0
    share, offset = M.offset_share(a)
    assert offset.tolist() == [[-1, 1, 0]]
    assert share[0].tolist() == pytest.approx([(T - 1) / T, (T - 1) / T, 1.0])


def test_fixed_offset_head_is_positional():
    a = pattern([min(i + 2, T - 1) for i in range(T)])
    share, offset = M.offset_share(a)
    assert int(offset) == 2 and float(share) == pytest.approx(5 / 7)


def test_special_punctuation_and_confidence():
    sink = pattern([0] * T)
    a = torch.full((1, 1, T, T), 0.0)
    a[..., [3, 5]] = 0.5  # every row splits between ',' and '.'
    both = stack(sink, a)
    assert M.special_mass(both, TOKENS)[0].tolist() == [1.0, 0.0]
    assert M.punctuation_mass(both, TOKENS)[0].tolist() == [0.0, 1.0]
    assert M.confidence(both)[0].tolist() == [1.0, 0.5]
    content = M.confidence(both, TOKENS, exclude_special=True)[0]
    assert content[0] == 0.0  # a sink has nothing left once special tokens are dropped
    assert content[1] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs the tokens"):
        M.confidence(both, exclude_special=True)
    assert M.is_punctuation("##.") and not M.is_punctuation("cat") and not M.is_punctuation("")


def test_entropy():
    uniform = torch.full((1, 1, T, T), 1.0 / T)
    nats, norm = M.entropy(stack(uniform, pattern(range(T))))
    assert nats[0].tolist() == pytest.approx([math.log(T), 0.0], abs=1e-6)
    assert norm[0].tolist() == pytest.approx([1.0, 0.0], abs=1e-6)


def test_js_distance():
    a = stack(
        pattern(range(T)), pattern(range(T)), pattern([0] * T), torch.full((1, 1, T, T), 1 / T)
    )
    d = M.js_distance(a)
    assert d.shape == (4, 4)
    assert d[0, 1] == pytest.approx(0, abs=1e-12) and d[0, 0] == pytest.approx(0, abs=1e-12)
    # Rows 1..T-1 are disjoint one-hots (divergence 1), row 0 is shared (0): sqrt of the mean.
    assert d[0, 2] == pytest.approx(math.sqrt((T - 1) / T))
    assert torch.allclose(d, d.T)
    assert 0 < d[0, 3] < 1


def test_rollout():
    identity = pattern(range(T)).expand(3, 1, T, T)
    torch.testing.assert_close(M.rollout(identity), torch.eye(T, dtype=torch.float64))
    r = M.rollout(stack(pattern([0] * T), pattern([0] * T)).reshape(2, 1, T, T))
    torch.testing.assert_close(r.sum(-1), torch.ones(T, dtype=torch.float64))
    # Half residual, half sink, twice: token i keeps 0.25 of itself, the rest flows from [CLS].
    assert r[3, 3] == pytest.approx(0.25) and r[3, 0] == pytest.approx(0.75)


def test_copy_scores():
    n, first, second = 3, 1, 6  # positions: [CLS] a b c x x a b c [SEP] -> T = 10
    dup = torch.zeros(1, 2, 10, 10)
    for t in range(n):
        dup[0, 0, second + t, first + t] = 1.0  # duplicate-token head
        if t + 1 < n:
            dup[0, 1, second + t, first + t + 1] = 1.0  # induction head
    d, i = M.copy_scores(dup, first, second, n)
    assert d[0].tolist() == [1.0, 0.0]
    assert i[0].tolist() == [0.0, 1.0]


def test_head_metrics_and_corpus_average():
    a = stack(pattern([0, *list(range(T - 1))]), pattern([0] * T))
    m = M.head_metrics(a, TOKENS)
    assert set(m) >= {"previous", "special", "entropy_norm", "confidence_content"}
    b = stack(pattern(range(T)), pattern([0] * T))
    avg = M.corpus_metrics([(a, TOKENS), (b, TOKENS)])
    assert avg["previous"][0, 0] == pytest.approx(0.5)
    assert avg["special"][0, 1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="tokens for attention"):
        M.head_metrics(a, TOKENS[:-1])
    with pytest.raises(ValueError, match=r"\(L, H, T, T\)"):
        M.previous_token(torch.zeros(2, 3, 4))


def test_roles_state_the_measured_number():
    a = stack(pattern([0, *list(range(T - 1))]), pattern([0] * T), torch.full((1, 1, T, T), 1 / T))
    roles = head_roles(M.head_metrics(a, TOKENS))
    assert str(roles[0][0][0]).startswith("previous-token head: 1.00 of its attention on token i-1")
    assert roles[0][1][0].role == "special-token sink"
    assert roles[0][2][0].role == "broad"
    top = strongest(roles, 2)
    assert len(top) == 2 and top[0].strength >= top[1].strength


def test_previous_token_at_a_distance():
    back2 = pattern([0, 0, *list(range(T - 2))])  # query i -> key i - 2 (rows 0, 1: key 0)
    a = stack(back2, pattern([0, *list(range(T - 1))]))
    assert M.previous_token(a, 2)[0].tolist() == [1.0, 0.0]
    assert M.previous_token(a)[0].tolist() == [pytest.approx(1 / (T - 1)), 1.0]
    by = M.previous_by_distance(a, (1, 2, 3))
    assert by.shape == (3, 1, 2)
    best, distance = M.best_offset(by, (1, 2, 3))
    assert distance.tolist() == [[2, 1]] and best[0].tolist() == [1.0, 1.0]


def copies(n=3, first=1, second=6, length=11, offsets=(0, 1, 2, -1)):
    """(1, H, T, T): head h sends every query of the second copy to first + t + offsets[h]
    (where that key lies in the first copy); other rows attend to themselves."""
    a = torch.zeros(1, len(offsets), length, length)
    for h, o in enumerate(offsets):
        for i in range(length):
            a[0, h, i, i] = 1.0
        for t in range(n):
            if 0 <= t + o < n:
                a[0, h, second + t, second + t] = 0.0
                a[0, h, second + t, first + t + o] = 1.0
    return a


def test_copy_mass_finds_each_offset():
    a = copies(n=4)
    assert M.copy_mass(a, 1, 6, 4, 0)[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert M.copy_mass(a, 1, 6, 4, 1)[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert M.copy_mass(a, 1, 6, 4, 2)[0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert M.copy_mass(a, 1, 6, 4, -1)[0].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert M.copy_mass(a, 1, 6, 4, 4).tolist() == [[0.0] * 4]  # no t has a key in the copy
    by = M.copy_mass_by_offset(a, 1, 6, 4, (1, 2, -1))
    best, offset = M.best_offset(by, (1, 2, -1))
    # the duplicate-token head scores 0 at every scanned offset: the tie goes to +1
    assert offset.tolist() == [[1, 1, 2, -1]]
    assert best[0].tolist() == [0.0, 1.0, 1.0, 1.0]
    # the old two-score helper agrees
    dup, ind = M.copy_scores(a, 1, 6, 4)
    assert dup[0].tolist() == [1.0, 0.0, 0.0, 0.0] and ind[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="do not fit 11 positions"):
        M.copy_mass(a, 1, 3, 4, 1)  # overlapping copies


def test_best_offset_ties_and_errors():
    scores = torch.tensor([[[0.2, 0.5]], [[0.2, 0.1]], [[0.1, 0.5]]])  # (O=3, L=1, H=2)
    best, offset = M.best_offset(scores, (3, -1, 7))
    assert offset.tolist() == [[3, 3]]  # ties go to the earlier listed offset
    assert best.tolist() == [[pytest.approx(0.2), 0.5]]
    best, offset = M.best_offset(scores, (7, -1, 3))
    assert offset.tolist() == [[7, 7]]
    with pytest.raises(ValueError, match=r"scores must have shape \(O, L, H\) with O = 2"):
        M.best_offset(scores, (1, 2))


def test_sink_mass_excludes_the_sink_rows():
    sink = pattern([0] * T)
    half = torch.zeros(1, 1, T, T)
    half[0, 0, :, 0] = 0.5
    half[0, 0, torch.arange(T), torch.arange(T)] += 0.5  # row 0: all on itself
    a = stack(sink, half, pattern(range(T)))
    assert M.sink_mass(a)[0].tolist() == [1.0, 0.5, 0.0]
    # two sinks: BOS and the last token; the rows of both are left out
    assert M.sink_mass(a, (0, -1))[0].tolist() == [1.0, 0.5, 0.0]
    assert M.sink_mass(a, range(T)).tolist() == [[0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="sink position 7 is outside 7 positions"):
        M.sink_mass(a, (7,))


def test_aligned_mass_on_a_reversal():
    Tq, Tk, n = 5, 6, 4  # 4 real tokens; query 4 and key 4, 5 are padding
    anti = torch.zeros(1, 2, Tq, Tk)
    for t in range(n):
        anti[0, 0, t, n - 1 - t] = 1.0  # head 0: the anti-diagonal
        anti[0, 1, t, t] = 1.0  # head 1: the diagonal (right only where t == n - 1 - t: never)
    anti[0, :, 4, 5] = 1.0  # a padding query, excluded
    aligned = torch.tensor([3, 2, 1, 0, -1])
    assert M.aligned_mass(anti, aligned)[0].tolist() == [1.0, 0.0]
    assert M.aligned_mass(anti, torch.full((Tq,), -1)).tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match=r"aligned must have shape \(Tq,\) = \(5,\)"):
        M.aligned_mass(anti, aligned[:4])
    with pytest.raises(ValueError, match=r"aligned key indices must lie in \[-1, 5\]"):
        M.aligned_mass(anti, torch.tensor([6, 0, 0, 0, 0]))
