"""Deprecated path: moved to `multihead.hooked.ablation` in 0.3 (see `multihead.moved`)."""

from ..hooked import ablation as _new
from ..moved import moved

moved(__name__, _new)
