"""attribution_patch on the real SmolLM2-135M-Instruct GGUF, the factual-recall study of the docs
("The Eiffel Tower is in the city of" vs "The Colosseum is in the city of", the logit of
" Paris"), against real patch():
- per head, the plain gradient estimate misses the target, and verify=10 reaches it (Pearson
  r >= 0.95, at least 8 of the real top 10 in its top 10): the best configuration the docs'
  measurement found (GradDrop alone reaches r = 0.88 on magnitudes, not the target);
- per key/value head's key (hook_k), AtP*'s QK fix reaches the same target where the estimate
  linear through the softmax does not."""

import warnings

import pytest
import torch

from multihead.bench.attribution import fact, overlap
from multihead.interpret import attribution_patch, patch


def pearson(a, b):
    return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]).double())[0, 1])


@pytest.fixture
def one_thread():
    """One thread: on a shared 2-core machine, two threads cost this test 3x the time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_verified_attribution_ranks_the_fact_study_as_real_patching(smollm2, one_thread):
    clean, corrupted, metric = fact(smollm2)
    real = patch(smollm2, clean, corrupted, metric, qk="k")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # heads and keys: no warning
        plain = attribution_patch(smollm2, clean, corrupted, metric, qk="k", qk_fix=False)
        fixed = attribution_patch(smollm2, clean, corrupted, metric, qk="k", heads=False)
        checked = attribution_patch(smollm2, clean, corrupted, metric, verify=10)
    assert pearson(real.heads, plain.heads) < 0.9  # the linear estimate alone falls short
    assert pearson(real.heads, checked.heads) >= 0.95
    assert overlap(real.heads, checked.heads) >= 8
    keys = real.qk["k"]  # (30, 3): SmolLM2's 3 kv heads per block
    assert keys.shape == (30, 3)
    assert pearson(keys, plain.qk["k"]) < 0.8  # linear through a saturated softmax
    assert pearson(keys, fixed.qk["k"]) >= 0.95
    assert overlap(keys, fixed.qk["k"]) >= 8
