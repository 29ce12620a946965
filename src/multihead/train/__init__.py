"""Training demos that watch heads specialise: induction heads forming in a small causal model
(`train_induction`) and cross-attention learning the alignment of sequence reversal
(`train_reverse`). Plots (matplotlib, an optional extra) live in `train.plots`; the command
line (`multihead train induction|reverse`) in `multihead/cli/train*.py`."""

from .induction import InductionConfig, InductionRun, train_induction
from .reverse import ReverseConfig, ReverseRun, train_reverse

__all__ = [
    "InductionConfig",
    "InductionRun",
    "ReverseConfig",
    "ReverseRun",
    "train_induction",
    "train_reverse",
]
