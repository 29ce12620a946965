"""Interventions refuse a meaningless metric: NaN or infinite on the clean or the corrupted run is
one clear error naming the run and the value, never a table of NaN."""

import math

import pytest
import torch

from multihead import CausalLM, LMConfig
from multihead.hooked.metric_checks import check_metric_pair
from multihead.interpret import patch

B, T, V = 2, 6, 37


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(3)
    model = CausalLM(LMConfig(vocab_size=V, dim=18, num_layers=2, num_heads=3, ffn_dim=28)).eval()
    clean = torch.randint(0, V, (B, T))
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1) % V
    return model, clean, corrupted


def test_metric_nan_on_both_runs_is_refused(setup):
    model, clean, corrupted = setup
    with pytest.raises(ValueError, match=r"metric is nan on the clean run"):
        patch(model, clean, corrupted, lambda logits: logits.sum() * float("nan"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_metric_non_finite_on_the_corrupted_run_is_refused(setup, bad):
    model, clean, corrupted = setup

    def metric(logits):  # finite on the clean input only
        return logits[:, -1, 5].mean() + (0.0 if torch.equal(logits, clean_logits) else bad)

    with torch.no_grad():
        clean_logits = model(clean)
    with pytest.raises(ValueError, match=rf"metric is {bad} on the corrupted run"):
        patch(model, clean, corrupted, metric)


def test_check_metric_pair_rules():
    assert check_metric_pair(2.0, 0.5) == 1.5
    for clean, corrupted, run in [(math.nan, 1.0, "clean"), (1.0, math.inf, "corrupted")]:
        with pytest.raises(ValueError, match=f"on the {run} run"):
            check_metric_pair(clean, corrupted)
    with pytest.raises(ValueError, match="no difference to recover"):
        check_metric_pair(0.25, 0.25)


# Issue 40: attribution_patch as strict as patch(), and told apart from inference_mode.
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_attribution_patch_refuses_a_non_finite_metric(setup, bad):
    from multihead.interpret import attribution_patch

    model, clean, corrupted = setup
    with pytest.raises(ValueError, match=rf"metric is {bad} on the clean run"):
        attribution_patch(model, clean, corrupted, lambda logits: logits.sum() * bad)


def test_attribution_patch_refuses_a_metric_non_finite_on_the_corrupted_run(setup):
    from multihead.interpret import attribution_patch

    model, clean, corrupted = setup
    with torch.no_grad():
        clean_logits = model(clean)

    def metric(logits):
        finite = torch.equal(logits.detach(), clean_logits)
        return logits[:, -1, 5].mean() + (0.0 if finite else float("nan"))

    with pytest.raises(ValueError, match=r"metric is nan on the corrupted run"):
        attribution_patch(model, clean, corrupted, metric)


def test_attribution_patch_under_inference_mode_names_it(setup):
    from multihead.interpret import attribution_patch

    model, clean, corrupted = setup
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"torch.inference_mode\(\)"):
        attribution_patch(model, clean, corrupted, lambda logits: logits[:, -1, 5].mean())
    with torch.no_grad():  # no_grad is fine: it enables grad itself
        result = attribution_patch(model, clean, corrupted, lambda logits: logits[:, -1, 5].mean())
    assert torch.isfinite(result.heads).all()
