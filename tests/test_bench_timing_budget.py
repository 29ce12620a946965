"""`bench.timing.measure_rounds`' budget: a cheap row runs more than the rounds asked (as many
as the budget holds at the warm-up round's pace, at most MAX_ROUNDS_FACTOR x), an expensive
one the rounds asked; no budget, the rounds asked."""

import time

from multihead.bench.timing import MAX_ROUNDS_FACTOR, measure_rounds


def sleeper(seconds: float):
    return lambda: time.sleep(seconds)


def rounds_of(seconds: float, budget: float, repeats: int = 2) -> int:
    samples = measure_rounds(
        {"a": sleeper(seconds), "b": sleeper(seconds)},
        repeats=repeats, warmup=1, min_time=0.0, budget=budget,
    )  # fmt: skip
    assert len(samples["a"]) == len(samples["b"])
    return len(samples["a"])


def test_a_cheap_row_runs_more_rounds_up_to_the_cap():
    assert rounds_of(0.002, budget=10.0) == MAX_ROUNDS_FACTOR * 2  # (the cap)
    assert 2 < rounds_of(0.01, budget=0.1) <= 5  # ~0.02 s a round: ~5 in 0.1 s


def test_an_expensive_row_and_no_budget_run_the_rounds_asked():
    assert rounds_of(0.03, budget=0.1) == 2  # ~0.06 s a round: the budget holds fewer
    assert rounds_of(0.002, budget=0.0) == 2
