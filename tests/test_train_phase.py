"""Phase-change detection on hand-built curves with known answers."""

import pytest

from multihead.train.phase import detect, smooth, steepest_change

STEPS = list(range(0, 1100, 100))  # 0, 100, ..., 1000
# A plateau at 3, a fall between 500 and 700, a floor at 0.5.
LOSS = [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 1.5, 0.5, 0.5, 0.5, 0.5]
FIRST = [3.5] * 11
# Induction rises over the same interval.
INDUCTION = [0.05] * 6 + [0.5, 0.8, 0.8, 0.8, 0.8]


def test_smooth():
    assert smooth([0, 3, 6, 0], 3) == [1.5, 3.0, 3.0, 3.0]
    assert smooth([1, 2], 1) == [1, 2]
    with pytest.raises(ValueError, match="window"):
        smooth([1.0], 0)


def test_steepest_change():
    # unsmoothed (the default): the fall 3.0 -> 1.5 and 1.5 -> 0.5: the first is steeper
    assert steepest_change(STEPS, LOSS, falling=True) == 550
    assert steepest_change(STEPS, INDUCTION, falling=False, window=1) == 550
    # smoothed over 3 points the fall is spread over 500..700; its steepest pair is 550 or 650
    assert steepest_change(STEPS, LOSS, falling=True, window=3) in (550, 650)
    assert steepest_change([0], [1.0], falling=True) is None
    with pytest.raises(ValueError, match="steps must increase"):
        steepest_change([0, 0], [1.0, 2.0], falling=True)
    with pytest.raises(ValueError, match="2 steps for 3 values"):
        steepest_change([0, 1], [1.0, 2.0, 3.0], falling=True)


def test_detect_a_phase_change_that_coincides():
    p = detect(STEPS, FIRST, LOSS, INDUCTION, tolerance=150)
    assert p.formed and p.step in (550, 650) and p.induction_step in (550, 650)
    assert p.induction_formed and p.coincides


def test_the_early_fall_of_both_losses_is_not_the_phase_change():
    # both copies fall from 6.0 to 3.0 in the first 100 steps (token frequencies): steeper per
    # step than the later fall, but it does not open a gap between the copies
    first = [6.0] + [3.0] * 10
    second = [6.0, 3.0, 3.0, 3.0, 3.0, 3.0, 2.5, 0.8, 0.5, 0.5, 0.5]
    assert steepest_change(STEPS, second, falling=True, window=1) == 50
    p = detect(STEPS, first, second, INDUCTION, tolerance=150, window=1)
    assert p.step == 650 and p.coincides


def test_a_loss_fall_without_an_induction_head_does_not_coincide():
    weak = [0.05] * 6 + [0.2, 0.25, 0.25, 0.25, 0.25]  # rises at the same time, stays < 0.3
    p = detect(STEPS, FIRST, LOSS, weak, tolerance=150)
    assert p.formed and not p.induction_formed and not p.coincides


def test_detect_an_induction_rise_far_from_the_loss_fall():
    late = [0.05] * 9 + [0.8, 0.8]  # rises between 800 and 900
    p = detect(STEPS, FIRST, LOSS, late, tolerance=150)
    assert p.formed and not p.coincides and p.induction_step is not None
    assert p.induction_step >= 750


def test_detect_no_phase_change_on_a_plateau():
    flat = [3.0, 2.9, 2.8, 2.8, 2.7, 2.7, 2.6, 2.6, 2.6, 2.5, 2.5]
    p = detect(STEPS, FIRST, flat, INDUCTION, tolerance=150)
    assert not p.formed and p.step is None and not p.coincides
    with pytest.raises(ValueError, match="at least one evaluation"):
        detect([], [], [], [], tolerance=1)
    with pytest.raises(ValueError, match="one value per evaluation"):
        detect([0, 1], [1.0], [1.0, 1.0], [0.0, 0.0], tolerance=1)
