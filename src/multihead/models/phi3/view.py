"""Phi-3's fused projections as the Llama keys they stand for: qkv_proj (rows q | k | v) as
q_proj, k_proj, v_proj and gate_up_proj (rows gate | up) as gate_proj, up_proj, so the Llama
key map reads a Phi-3 checkpoint."""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..checkpoint import Checkpoint
from ..view import CheckpointView, Part, row_range


def phi3_view(checkpoint: Checkpoint, config: LMConfig) -> Checkpoint:
    D = config.head_dim or config.dim // config.num_heads
    q, kv = config.num_heads * D, (config.num_kv_heads or config.num_heads) * D
    ffn = config.ffn_dim or 4 * config.dim
    splits = {
        "self_attn.qkv_proj": (
            ("q_proj", 0, q),
            ("k_proj", q, q + kv),
            ("v_proj", q + kv, q + 2 * kv),
        ),
        "mlp.gate_up_proj": (("gate_proj", 0, ffn), ("up_proj", ffn, 2 * ffn)),
    }
    parts: dict[str, Part] = {}
    for key in checkpoint.infos:
        stem, _, kind = key.rpartition(".")
        for fused, pieces in splits.items():
            if stem.endswith(fused):
                prefix = stem.removesuffix(fused.rpartition(".")[2])
                for name, start, stop in pieces:
                    parts[f"{prefix}{name}.{kind}"] = row_range(key, start, stop)
    return CheckpointView(checkpoint, parts)
