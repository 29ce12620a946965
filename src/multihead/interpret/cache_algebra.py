"""Deprecated path: moved to `multihead.hooked.cache_algebra` in 0.3 (see `multihead.moved`)."""

from ..hooked import cache_algebra as _new
from ..moved import moved

moved(__name__, _new)
