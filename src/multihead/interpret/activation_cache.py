"""Deprecated path: moved to `multihead.hooked.activation_cache` in 0.3 (see `multihead.moved`)."""

from ..hooked import activation_cache as _new
from ..moved import moved

moved(__name__, _new)
