"""Deprecated path: moved to `multihead.hooked.steps` in 0.3 (see `multihead.moved`)."""

from ..hooked import steps as _new
from ..moved import moved

moved(__name__, _new)
