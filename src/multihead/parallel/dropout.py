"""Deprecated path: moved to `multihead.functional.dropout_mask` in 0.3 (see `multihead.moved`)."""

from ..functional import dropout_mask as _new
from ..moved import moved

moved(__name__, _new)
