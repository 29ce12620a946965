"""The bridge: any transformers model that calls transformers' attention registry, run through
multihead's attention and given multihead's hook points (an adapter at the edge: native models
and modules never import it). `wrap(model)` for a model you built; `load_bridged(source)` (and
`multihead.load` for a checkpoint with no native family) for a checkpoint. See docs/bridge.md."""

from .attention import NAME, bridge_attention, register
from .discover import BridgeError
from .loading import bridged_class, bridged_gguf_class, load_bridged
from .model import BridgeConfig, BridgedModel
from .wrapping import wrap

__all__ = [
    "NAME",
    "BridgeConfig",
    "BridgeError",
    "BridgedModel",
    "bridge_attention",
    "bridged_class",
    "bridged_gguf_class",
    "load_bridged",
    "register",
    "wrap",
]
