"""attribution_patch on the real SmolLM2-135M-Instruct GGUF, the factual-recall study of the docs
("The Eiffel Tower is in the city of" vs "The Colosseum is in the city of", the logit of
" Paris"): per head, the plain gradient estimate misses the target against real patch(), and
verify=10 reaches it (Pearson r >= 0.95, at least 8 of the real top 10 in its top 10)."""

import warnings

import torch

from multihead.bench.attribution import fact, overlap
from multihead.interpret import attribution_patch, patch


def pearson(a, b):
    return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]).double())[0, 1])


def test_verified_attribution_ranks_the_fact_study_as_real_patching(smollm2):
    clean, corrupted, metric = fact(smollm2)
    real = patch(smollm2, clean, corrupted, metric)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # heads alone: no warning
        plain = attribution_patch(smollm2, clean, corrupted, metric)
        checked = attribution_patch(smollm2, clean, corrupted, metric, verify=10)
    assert pearson(real.heads, plain.heads) < 0.9  # the linear estimate alone falls short
    assert pearson(real.heads, checked.heads) >= 0.95
    assert overlap(real.heads, checked.heads) >= 8
