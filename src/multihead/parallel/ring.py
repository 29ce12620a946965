"""The ring: each rank sends to rank + 1 and receives from rank - 1 (within the group), with
asynchronous point-to-point ops so that a transfer runs while the rank computes.

Every rank posts its transfers in the same order, which is what NCCL needs to pair them (it
ignores tags); gloo pairs them by (peer, tag) in order, and the two streams of the backward ring
use different tags.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist
from torch import Tensor

KEYS_TAG = 0  # keys, values and their mask going round
GRADS_TAG = 1  # the backward ring's key/value gradient accumulators


class Transfer:
    """Transfers in flight; `wait()` returns the received tensors once they have arrived."""

    def __init__(self, works: list, sent: list[Tensor], received: list[Tensor]) -> None:
        self._works = works
        self._sent = sent  # kept alive until the sends complete
        self.received = received

    def wait(self) -> list[Tensor]:
        for work in self._works:
            work.wait()
        received, self.received = self.received, []
        self._works, self._sent = [], []  # hold nothing once done: the caller owns the buffers
        return received


class Ring:
    """Neighbours of this rank in `group` (None: the default group), by global rank."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        world = dist.group.WORLD
        resolved = group if group is not None else world
        if resolved is None:
            raise ValueError("torch.distributed has no default group: call init_process_group")
        self.group: dist.ProcessGroup = resolved
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def source(self, step: int) -> int:
        """Group rank whose keys this rank holds after `step` hops."""
        return (self.rank - step) % self.size

    def shift(self, send: Sequence[Tensor], receive: Sequence[Tensor], tag: int) -> Transfer:
        """Start sending `send` to the next rank and receiving into `receive` from the previous
        one (buffers the caller allocated with the incoming shapes)."""
        sent = [t.contiguous() for t in send]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag) for t in sent]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, tag) for t in receive]
        return Transfer(dist.batch_isend_irecv(ops), sent, list(receive))
