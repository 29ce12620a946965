"""A checkpoint seen through a family's eyes: fused tensors presented as the parts a key map
reads (Phi-3's qkv_proj and gate_up_proj, GPT-NeoX's per-head query_key_value), so families
that differ only in how a file fuses its matrices share one key map.

A `Part` names the rows of a stored tensor (dim 0) that make one presented tensor: a range, or
an index list for interleaved layouts. The fused tensor is read once per part it feeds (the last
one read is kept while its parts are taken), straight from the checkpoint's own reader.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .checkpoint import Checkpoint, TensorInfo


@dataclass(frozen=True)
class Part:
    source: str  # the stored (fused) tensor
    rows: tuple[int, ...]  # its rows (dim 0) that make this part, in order


def row_range(source: str, start: int, stop: int) -> Part:
    return Part(source, tuple(range(start, stop)))


class CheckpointView(Checkpoint):
    """`base` with each stored tensor of `parts` replaced by the tensors made from it."""

    def __init__(self, base: Checkpoint, parts: dict[str, Part]) -> None:
        infos = dict(base.infos)
        for name, part in parts.items():
            info = base.infos.get(part.source)
            if info is None:
                continue  # absent: the key map names the part as missing
            rows = info.shape[0] if info.shape else 0
            if not part.rows or max(part.rows) >= rows:
                raise ValueError(
                    f"{base.source}: {part.source!r} has {rows} rows, fewer than the "
                    f"{max(part.rows, default=0) + 1} its parts ({name!r}, ...) need: the config "
                    "does not describe this tensor"
                )
            infos[name] = TensorInfo(info.dtype, (len(part.rows), *info.shape[1:]))
        for part in parts.values():
            infos.pop(part.source, None)
        super().__init__(base.source, infos)
        self.base, self.parts = base, parts
        self._held: tuple[str, Tensor] | None = None

    def read(self, name: str, out: Tensor | None = None) -> Tensor:
        part = self.parts.get(name)
        if part is None:
            return self.base.read(name, out)
        if self._held is None or self._held[0] != part.source:
            self._held = (part.source, self.base.read(part.source))
        fused = self._held[1]
        index = torch.tensor(part.rows, dtype=torch.long, device=fused.device)
        value = fused.index_select(0, index)
        return value if out is None else out.copy_(value)

    def close(self) -> None:
        self._held = None
        self.base.close()

    def __enter__(self) -> CheckpointView:
        self.base.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
