"""Deprecated path: moved to `multihead.modules.static_cache` in 0.3 (see `multihead.moved`)."""

from .modules import static_cache as _new
from .moved import moved

moved(__name__, _new)
