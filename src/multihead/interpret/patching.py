"""Deprecated path: moved to `multihead.hooked.patching` in 0.3 (see `multihead.moved`)."""

from ..hooked import patching as _new
from ..moved import moved

moved(__name__, _new)
