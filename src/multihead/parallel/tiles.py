"""Deprecated path: moved to `multihead.functional.tiles` in 0.3 (see `multihead.moved`)."""

from ..functional import tiles as _new
from ..moved import moved

moved(__name__, _new)
