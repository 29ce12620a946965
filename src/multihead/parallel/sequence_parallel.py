"""Sequence parallelism for whole models: every `MultiHeadAttention` self-attention runs as ring
attention over a process group, each rank holding one chunk of the sequence (a layout of
`layout.py`), so a model trains on sequences no single device could attend over.

`sequence_parallel(model, group, layout=...)` attaches a `RingRunner` to each self-attention
module (`MultiHeadAttention._sequence_parallel`, the one check its forward makes) and, on a
`CausalLM`, a forward pre-hook that gives the model its chunk's global positions (learned
positions and RoPE read them; with an attention_mask they are counted over real tokens across
the whole sequence, as in one process). ALiBi biases come from global slots inside the ring.
Everything outside attention works per token and needs no communication.

Shapes: a rank's chunk x (B, T_r, C); key_mask / attention_mask (B, T_r); q (B, H, T_r, D).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..functional.call import check_flag
from ..hook_points import hooks_for
from ..modules.attend import WEIGHT_POINTS
from ..modules.attention import MultiHeadAttention
from ..modules.attention_inputs import batch_inputs, check_key_mask, check_positions
from ..modules.block import TransformerBlock
from ..modules.lm import CausalLM
from ..modules.stacks import EncoderDecoder
from .checks import BiasFn, _comm_device, check_group
from .layout import Segment, check_layout, positions_of, segments_from_lengths
from .ring import Ring
from .ring_attention import ring_attention


def chunk_segments(ring: Ring, length: int, batch: int, layout: str, like: Tensor):
    """Every rank's segments, learned from every rank's chunk length (one all-gather)."""
    row = torch.tensor([length, batch], dtype=torch.long, device=_comm_device(ring, like))
    rows = [torch.empty_like(row) for _ in range(ring.size)]
    dist.all_gather(rows, row, group=ring.group)
    table = torch.stack(rows).tolist()
    batches = [b for _, b in table]
    if len(set(batches)) > 1:
        raise ValueError(
            f"sequence parallelism: every rank must hold the same batch size, got {batches}"
        )
    return segments_from_lengths([n for n, _ in table], layout)


class RingRunner:
    """Runs one `MultiHeadAttention`'s self-attention as ring attention over `group`."""

    def __init__(self, ring: Ring, layout: str, block_size: int) -> None:
        self.ring, self.layout, self.block_size = ring, layout, block_size

    def __repr__(self) -> str:
        return f"RingRunner(ranks={self.ring.size}, layout={self.layout!r})"

    def __call__(
        self,
        module: MultiHeadAttention,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool | None = None,
        return_weights: bool = False,
        cache: Any = None,
        positions: Tensor | None = None,
        lengths: Any = None,
        window: int | tuple[int, int] | None = None,
        documents: Tensor | None = None,
        prefix: Any = None,
        mask_mod: Any = None,
        block_size: Any = None,
    ) -> Tensor:
        """`MultiHeadAttention.forward` on this rank's chunk of a sharded sequence. `window`
        (global positions) and `documents` (this rank's ids, (B, T_r)) go to the ring."""
        causal = module.causal if causal is None else check_flag("causal", causal)
        self_attention = key is None or (key is query and (value is None or value is query))
        refused = {
            "key/value (cross-attention)": None if self_attention else key,
            "mask": mask,
            "cache": cache,
            "lengths": lengths,
            "return_weights": return_weights or None,
            "prefix": prefix,
            "mask_mod": mask_mod,  # not carried round the ring (ring_attention's bias_fn can block)
            "block_size": block_size,
        }
        given = [name for name, arg in refused.items() if arg is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)} cannot be used under sequence parallelism: each rank holds a "
                "chunk of one sequence and attends over the ring (use key_mask, causal, window "
                "and documents; "
                "weights (T x T) are never built)"
            )
        hooks = hooks_for(module)
        if hooks is not None and (hooks.observers or any(p in hooks for p in WEIGHT_POINTS)):
            raise ValueError(
                "hook_attn_scores, hook_pattern and capture need the (T, T) attention pattern, "
                "which sequence parallelism never builds; the other hook points show this "
                "rank's chunk"
            )
        x = batch_inputs(module, query, None, None, key_mask, False)
        B, T = x.query.shape[:2]
        if x.key_mask is not None:
            x = x._replace(key_mask=check_key_mask(x.key_mask, B, T, x.query.device))
        q, k, v = module._project(x.query, x.query, x.query, True)  # (B, heads, T_r, D)
        if hooks is not None:
            q, k, v = hooks.heads("hook_q", q), hooks.heads("hook_k", k), hooks.heads("hook_v", v)
        scheme = module.position
        if scheme is not None and scheme.uses_positions:
            if positions is None:  # this chunk's global positions
                segments = chunk_segments(self.ring, T, B, self.layout, q)
                positions = positions_of(segments[self.ring.rank], q.device)
            else:
                positions = check_positions(positions, B, T, q.device)
            q, k = scheme.rotate(q, k, positions)
            if hooks is not None:
                q, k = hooks.heads("hook_rot_q", q), hooks.heads("hook_rot_k", k)
        elif positions is not None:
            what = "no position scheme" if scheme is None else type(scheme).__name__
            raise ValueError(
                f"positions were given but this attention has {what}, which does not use them"
            )
        bias_fn = None
        if scheme is not None:
            probe = torch.arange(1, device=q.device)
            if scheme.bias(probe, probe) is not None:  # ALiBi, relative biases
                bias_fn = cast(BiasFn, scheme.bias)  # of the tile's global query and key slots
        dropout_p = module.dropout if module.training else 0.0
        # The ring's dropout mask is a function of a seed and global positions; the seed comes
        # from torch's default generator, which must be in the same state on every rank (the
        # ring checks that the seeds agree).
        seed = int(torch.randint(2**62, ())) if dropout_p > 0.0 else None
        out = ring_attention(
            q, k, v, group=self.ring.group, causal=causal, key_mask=x.key_mask,
            dropout_p=dropout_p, dropout_seed=seed, layout=self.layout, bias_fn=bias_fn,
            block_size=self.block_size, window=window, documents=documents,
        )  # fmt: skip
        y = module._output(out, hooks)
        return y[0] if x.unbatched else y


def _global_positions(ring: Ring, layout: str):
    """A CausalLM forward pre-hook: positions = the chunk's global positions, counted over real
    tokens when an attention_mask is given (left padding does not shift them), as one process
    counts them over the whole sequence."""

    def hook(model: nn.Module, args: tuple, kwargs: dict):
        for name in ("caches", "last_only"):
            if kwargs.get(name):
                raise ValueError(
                    f"{name} cannot be used under sequence parallelism (generation runs on one "
                    "process: the model's weights are whole on every rank)"
                )
        if kwargs.get("positions") is not None:
            return None
        ids = args[0] if args else kwargs["input_ids"]
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            return None  # the model's own check reports it
        B, T = ids.shape
        segments = chunk_segments(ring, T, B, layout, ids)
        mine = segments[ring.rank]
        mask = kwargs.get("attention_mask")
        if mask is None:
            positions = positions_of(mine, ids.device)  # (T_r,)
        else:
            positions = _counted_positions(ring, segments, mine, mask.bool(), ids)
        return args, {**kwargs, "positions": positions}

    return hook


def _counted_positions(
    ring: Ring, segments: list[list[Segment]], mine: list[Segment], mask: Tensor, like: Tensor
) -> Tensor:
    """(B, T_r): for each token, the number of real tokens before it in the whole sequence
    (clamped at 0): every rank shares its real-token count per segment (one all-gather)."""
    counts = torch.stack([mask[:, s.offset : s.offset + s.length].sum(-1) for s in mine], 1)
    device = _comm_device(ring, like)
    parts = [torch.empty_like(counts, device=device) for _ in range(ring.size)]
    dist.all_gather(parts, counts.to(device), group=ring.group)
    pieces = []
    for s in mine:
        before = sum(
            (parts[r][:, i].to(mask.device) for r in range(ring.size)
             for i, other in enumerate(segments[r]) if other.start < s.start),
            torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device),
        )  # fmt: skip
        local = mask[:, s.offset : s.offset + s.length].long().cumsum(-1)
        pieces.append(before[:, None] + local - 1)
    return torch.cat(pieces, dim=1).clamp(min=0)


def _refuse(model: nn.Module) -> None:
    from ..models.bert import BertEncoder  # lazily: models pulls in the loaders

    for name, module in model.named_modules():
        what = None
        if isinstance(module, BertEncoder | EncoderDecoder):
            what = (
                f"{type(module).__name__} adds absolute positions outside attention for a whole "
                "sequence (and an encoder-decoder attends to a memory): it is not supported"
            )
        elif isinstance(module, CausalLM) and module.config.sliding_window is not None:
            what = (
                "sliding-window attention (LMConfig.sliding_window) is not supported under "
                "sequence parallelism"
            )
        elif getattr(module, "_tensor_parallel", None) is not None:
            what = "tensor-parallel attention combined with sequence parallelism is not supported"
        elif getattr(module, "_sequence_parallel", None) is not None:
            what = "it is already sequence-parallel"
        if what:
            raise ValueError(f"sequence_parallel: {name or type(module).__name__}: {what}")


def sequence_parallel(
    model: nn.Module,
    group: dist.ProcessGroup | None = None,
    *,
    layout: str = "zigzag",
    block_size: int = 512,
) -> nn.Module:
    """Run every self-attention of `model` as ring attention over `group` (None: the default
    group), in place; returns the model.

    Afterwards each rank calls the model on its chunk of the sequence (`shard_sequence(x, P,
    rank, dim=1, layout=layout)` of the token ids, attention mask and labels) and gets its chunk
    of the output, equal to the unsharded model's. A loss over the whole sequence is the sum of
    the ranks' losses; gradients of the (replicated) weights are summed over the ranks as in
    data parallelism (DDP, FSDP2 or all_reduce).

    Cross-attention modules of decoder blocks stay as they are: their queries are the chunk and
    the memory (whole on every rank) is attended in full. Models that add absolute positions
    outside attention other than `CausalLM` (BERT, encoder-decoder) are refused: add their
    positions at `sequence_positions` yourself and apply this to their blocks.
    """
    ring = check_group(group)
    layout = check_layout(layout)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    _refuse(model)
    cross = {
        id(m.cross_attn)
        for m in model.modules()
        if isinstance(m, TransformerBlock) and m.cross_attn is not None
    }
    attention = [
        m for m in model.modules() if isinstance(m, MultiHeadAttention) and id(m) not in cross
    ]
    if not attention:
        raise ValueError(
            f"sequence_parallel: {type(model).__name__} has no MultiHeadAttention self-attention"
        )
    runner = RingRunner(ring, layout, block_size)
    for m in attention:
        m._sequence_parallel = runner
    for lm in model.modules():
        if isinstance(lm, CausalLM):
            lm.register_forward_pre_hook(_global_positions(ring, layout), with_kwargs=True)
    return model
