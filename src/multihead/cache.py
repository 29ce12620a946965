"""Deprecated path: moved to `multihead.modules.cache` in 0.3 (see `multihead.moved`)."""

from .modules import cache as _new
from .moved import moved

moved(__name__, _new)
