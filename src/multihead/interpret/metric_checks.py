"""Deprecated path: moved to `multihead.hooked.metric_checks` in 0.3 (see `multihead.moved`)."""

from ..hooked import metric_checks as _new
from ..moved import moved

moved(__name__, _new)
