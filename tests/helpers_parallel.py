"""Run a function on a small gloo world on this machine: `world_size` processes on 127.0.0.1,
forked from a forkserver that has imported torch once (so a world starts in well under a second
after the first), bounded in time.

The function is called as `fn(rank, world_size, *args)` in each process after
`init_process_group("gloo")`; it must be defined at module level (it is pickled by name). An
exception in any rank fails the call with that rank's traceback; a world that runs past
`timeout` seconds is killed.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Imported once in the forkserver, so each rank starts with them: torch imports some heavy modules
# lazily (assert_close and backward pull in DTensor and sympy: about a second per rank otherwise).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.fx.experimental.symbolic_shapes",
    "torch.testing",
    "torch._dynamo",  # entered by TorchDispatchMode
    "multihead",
    "multihead.parallel",
    "helpers_parallel",
]


def _entry(rank: int, fn: Callable, world_size: int, port: int, args: tuple) -> None:
    # Loopback only: gloo would otherwise pick the interface the hostname resolves to.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # several ranks share this machine's few cores
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_world(fn: Callable, world_size: int, *args, timeout: float = 120.0) -> None:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks; raise if any rank fails."""
    mp.set_forkserver_preload(_PRELOAD)
    # The store lives in this process: the ranks connect to it, so no port is guessed.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    context = mp.start_processes(
        _entry,
        args=(fn, world_size, store.port, args),
        nprocs=world_size,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.0, deadline - time.monotonic()), grace_period=5):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
            raise TimeoutError(f"a world of {world_size} ranks ran past {timeout} s")
    del store
