"""Deprecated path: moved to `multihead.hooked.scope` in 0.3 (see `multihead.moved`)."""

from ..hooked import scope as _new
from ..moved import moved

moved(__name__, _new)
