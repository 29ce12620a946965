"""Deprecated path: moved to `multihead.hooked.patch_batched` in 0.3 (see `multihead.moved`)."""

from ..hooked import patch_batched as _new
from ..moved import moved

moved(__name__, _new)
