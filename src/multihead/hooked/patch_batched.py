"""The batched patching engine of `patch()`: many patches in one forward, the unchanged prefix of
layers computed once.

Patching an activation of block l leaves blocks 0..l-1 of the corrupted run unchanged, so the
corrupted run is made once (with its residual stream cached before every block); the patches of
block l then start from the cached stream before block l, tiled along the batch, one copy per
patch, and only blocks l..L-1, the final norm and the head run. Heads are patched at hook_z by a
mask over (patch, position, head), queries at hook_q and keys at hook_k alike; residual streams
are patched before the suffix runs, with no hook. The metric reads each patch's own B rows of the
logits, exactly the output a one-by-one forward would give it (up to float rounding of the larger
matmuls).

Shapes: tiled batch N * B (patch-major: rows k*B .. k*B+B-1 belong to patch k); hook_z (N*B, T,
H, D) viewed as (N, B, T, H, D); logits (N*B, T, V).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..functional import masks
from ..hook_points import HookSession, hooks_for
from ..modules.lm import CausalLM
from .hooks import act_name, run_with_cache

# How many tokens (patches x B x T) one suffix forward may hold: bounds the (rows, T, V) logits
# at about 256 MB of fp32, and the tiled activations with them.
LOGIT_BUDGET = 2**26


def batched_refusal(model: Any, clean: tuple, kwargs: dict[str, Any]) -> str | None:
    """Why the batched engine cannot run this call (None when it can)."""
    if not isinstance(model, CausalLM):
        return f"it runs CausalLM models, got {type(model).__name__}"
    if len(clean) != 1 or not isinstance(clean[0], Tensor):
        return "it takes one input_ids tensor as the input"
    extra = set(kwargs) - {"attention_mask"}
    if extra:
        return f"it passes only attention_mask to the model, got {sorted(extra)}"
    if model.training:
        return "the model is in training mode (dropout would differ per patch): call .eval()"
    held = open_hooks(model)
    if held:
        return (
            f"hooks are open on the model ({held}: a hooks() / capture / head_gates context); "
            "the batched engine runs blocks on cached, tiled streams, which such hooks would "
            "see twice or not at all (engine='loop' runs every forward under them)"
        )
    return None


def open_hooks(model: Any) -> str:
    """The hook points that sessions open in this context hold on `model`, named ("" when
    none): what the batched engine cannot run under."""
    names: list[str] = []
    observers = False
    for module in model.modules():
        found = hooks_for(module)
        if found is None:
            continue
        names += [full for entries in found.fns.values() for _, full in entries]
        observers = observers or bool(found.observers)
    shown = sorted(set(names))
    text = ", ".join(shown[:4]) + (f" and {len(shown) - 4} more" if len(shown) > 4 else "")
    if observers:
        text = f"{text}, attention observers" if text else "attention observers"
    return text


@dataclass
class Suffix:
    """What every block needs besides its input, for the corrupted input tiled `n` times."""

    model: CausalLM
    key_mask: Tensor | None  # (B, T) True = real token
    positions: Tensor  # (T,) or (B, T)
    window_mask: Tensor | None

    @classmethod
    def of(cls, model: CausalLM, ids: Tensor, attention_mask: Tensor | None) -> Suffix:
        B, T = ids.shape
        key_mask = None if attention_mask is None else masks.from_hf_padding(attention_mask)
        positions = model._positions(B, T, ids.device, key_mask, None, None)
        window = model.config.sliding_window
        window_mask = None
        if window is not None:
            window_mask = masks.sliding_window(T, T, window, device=ids.device)
        return cls(model, key_mask, positions, window_mask)

    def run(self, start: int, x: Tensor, n: int) -> Tensor:
        """Logits of blocks `start`.. on `x` (n*B, T, C): what `model.forward` computes after
        its stream entered block `start` (start = L: only the final norm and the head)."""
        lm = self.model
        key_mask = None if self.key_mask is None else self.key_mask.repeat(n, 1)
        positions = self.positions if self.positions.dim() == 1 else self.positions.repeat(n, 1)
        for i in range(start, len(lm.layers)):
            x = lm.layers[i](
                x,
                mask=None if lm.config.window(i) is None else self.window_mask,
                key_mask=key_mask,
                positions=positions if lm.config.position == "rope" else None,
            )
        return lm.logits(lm.norm_f(x))


def _chunks(count: int, size: int) -> Iterator[range]:
    for start in range(0, count, size):
        yield range(start, min(count, start + size))


class BatchedPatcher:
    """Patches of one (clean, corrupted) pair, `per_forward` patches per suffix forward."""

    def __init__(
        self,
        model: CausalLM,
        clean_ids: Tensor,
        corrupted_ids: Tensor,
        attention_mask: Tensor | None,
        value: Callable[[Any], float],
        per_forward: int | None,
        points: tuple[str, ...] = ("z",),
    ) -> None:
        """`points`: the per-head hook points ("z", "q", "k") whose clean values are cached."""
        self.model, self.value = model, value
        self.B, self.T = corrupted_ids.shape
        L = len(model.layers)
        streams = [act_name("resid_pre", i) for i in range(L)]
        streams.append(act_name("resid_post", L - 1))
        zs = [act_name(point, i) for point in points for i in range(L)]
        mask = attention_mask
        _, self.clean = run_with_cache(model, clean_ids, names=streams + zs, attention_mask=mask)
        _, self.corrupted = run_with_cache(model, corrupted_ids, names=streams, attention_mask=mask)
        self.suffix = Suffix.of(model, corrupted_ids, attention_mask)
        if per_forward is None:
            vocab = model.config.vocab_size
            per_forward = max(1, min(4096, LOGIT_BUDGET // vocab) // (self.B * self.T))
        self.per_forward = per_forward

    def stream_before(self, layer: int, run: str) -> Tensor:
        """(B, T, C): the stream entering block `layer` (layer L: the final stream)."""
        cache = self.clean if run == "clean" else self.corrupted
        L = len(self.model.layers)
        return cache[act_name("resid_post", L - 1) if layer == L else act_name("resid_pre", layer)]

    def _metrics(self, logits: Tensor, n: int) -> list[float]:
        B = self.B
        return [self.value(logits[k * B : (k + 1) * B]) for k in range(n)]

    def heads(self, layer: int, by_position: bool, point: str = "z") -> Tensor:
        """Metric with each head of `layer` (at each position) patched at hook_{point} (z, q,
        or k: its H, or Hkv key/value heads): (H,) or (H, T)."""
        name = act_name(point, layer)
        clean_z = self.clean[name]  # (B, T, H, D)
        _, T, H, _ = clean_z.shape
        # patch k sets head k // T at position k % T (by position), or head k everywhere
        count = H * T if by_position else H
        values: list[float] = []
        x = self.stream_before(layer, "corrupted")
        for chunk in _chunks(count, self.per_forward):
            n = len(chunk)
            where = torch.zeros(n, 1, T, H, 1, dtype=torch.bool, device=clean_z.device)
            for j, k in enumerate(chunk):
                if by_position:
                    where[j, 0, k % T, k // T] = True
                else:
                    where[j, 0, :, k] = True

            def fn(z: Tensor, _: str, where: Tensor = where, n: int = n) -> Tensor:
                tiled = z.reshape(n, self.B, *z.shape[1:])  # (n*B, T, H, D) -> (n, B, T, H, D)
                return torch.where(where, clean_z, tiled).reshape(z.shape)

            with HookSession(self.model, [(name, fn)], writes=True).active():
                logits = self.suffix.run(layer, x.repeat(n, 1, 1), n)
            values += self._metrics(logits, n)
        grid = torch.tensor(values)
        return grid.reshape(H, T) if by_position else grid

    def stream(self, layer: int) -> Tensor:
        """Metric with the stream entering block `layer` (L: the final stream) taken from the
        clean run at one position at a time: (T,)."""
        clean, corrupted = (
            self.stream_before(layer, "clean"),
            self.stream_before(layer, "corrupted"),
        )
        T = self.T
        values: list[float] = []
        for chunk in _chunks(T, self.per_forward):
            n = len(chunk)
            x = corrupted.repeat(n, 1, 1).reshape(n, self.B, T, -1).clone()  # (n, B, T, C)
            for j, pos in enumerate(chunk):
                x[j, :, pos] = clean[:, pos]
            logits = self.suffix.run(layer, x.reshape(n * self.B, T, -1), n)
            values += self._metrics(logits, n)
        return torch.tensor(values)
