"""Deprecated path: moved to `multihead.hooked.hooks` in 0.3 (see `multihead.moved`)."""

from ..hooked import hooks as _new
from ..moved import moved

moved(__name__, _new)
