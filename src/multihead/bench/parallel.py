"""`multihead bench parallel`: ring attention at P = 1, 2, 4 ranks and growing sequence length,
per-rank peak memory and time, against `attention()` on the whole sequence in one process (the
tensor-parallel part lives in tensor_parallel.py and shares the world harness here).

It starts the processes itself: gloo on CPU (loopback), or NCCL with one GPU per rank when there
are enough GPUs. Memory per rank: the rank's inputs (q, k, v) plus the peak of what the call
creates: on CUDA, `torch.cuda.max_memory_allocated` above what was allocated before the call; on
CPU, the peak total size of the storages that torch ops return while the call runs (a dispatch
mode watches every op; frees are seen through weak references), which counts every tensor
created but not scratch memory that a single kernel allocates and frees inside. Time: the median
over `repeats` calls of the slowest rank.

Shapes: each rank holds q (B, H, T/P, D), k and v (B, Hkv, T/P, D).
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys
import time
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..functional import attention
from ..parallel import layout_segments, ring_attention
from ..table import format_table


class PeakTensorBytes(TorchDispatchMode):
    """Peak of the summed sizes of live storages created by torch ops inside the `with` block.

    Storages first seen as an op's input existed before (the caller's tensors): views of them
    are not counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._created: set[int] = set()
        self._outside: set[int] = set()

    def _forget(self, known: set[int], key: int, nbytes: int) -> None:
        known.discard(key)
        if known is self._created:
            self.live -= nbytes

    def _watch(self, t: torch.Tensor, known: set[int]) -> None:
        storage = t.untyped_storage()
        key, nbytes = id(storage), storage.nbytes()
        if key in self._created or key in self._outside:
            return  # a view of a storage already accounted for
        known.add(key)
        # When the storage dies its id may be reused: forget it then.
        weakref.finalize(storage, self._forget, known, key, nbytes)
        if known is self._created:
            self.live += nbytes
            self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self._watch(t, self._outside)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._watch(t, self._created)
        return out


def _peak_bytes(fn, device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with PeakTensorBytes() as tracker:
        fn()
    return tracker.peak


def _timed(fns: dict, device: torch.device, repeats: int) -> dict[str, float]:
    """Median over `repeats` rounds of the slowest rank's seconds per call of each function; the
    functions run in turn within each round (side by side), after one warm-up call each."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            took = torch.tensor([time.perf_counter() - start], device=device, dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            samples[name].append(float(took))
    return {name: statistics.median(s) for name, s in samples.items()}


def measure_rank(rank: int, world: int, device: torch.device, config: dict) -> list[dict]:
    """This rank's part of the benchmark in an initialised process group of `world` ranks: one
    row per sequence length (times and peak bytes already reduced over the ranks)."""
    B, H, Hkv, D = config["batch"], config["heads"], config["kv_heads"], config["head_dim"]
    dtype = getattr(torch, config["dtype"])
    grad = config["backward"]
    rows = []
    for T in config["seq_lens"]:
        mine = layout_segments(T, world, config["layout"])[rank]
        n = sum(s.length for s in mine)
        torch.manual_seed(rank)
        q = torch.randn(B, H, n, D, device=device, dtype=dtype, requires_grad=grad)
        k = torch.randn(B, Hkv, n, D, device=device, dtype=dtype, requires_grad=grad)
        v = torch.randn(B, Hkv, n, D, device=device, dtype=dtype, requires_grad=grad)

        def ring(q=q, k=k, v=v):
            out = ring_attention(q, k, v, causal=config["causal"], layout=config["layout"],
                                 block_size=config["block_size"])  # fmt: skip
            if grad:
                out.sum().backward()

        def whole(q=q, k=k, v=v):
            out = attention(q, k, v, causal=config["causal"])
            if grad:
                out.sum().backward()

        held = sum(t.numel() * t.element_size() for t in (q, k, v))
        # In a world of one, attention() on the same (whole) sequence runs side by side.
        fns = {"ring": ring, "attention": whole} if world == 1 else {"ring": ring}
        row: dict = {"T": T, "P": world}
        for name, seconds in _timed(fns, device, config["repeats"]).items():
            # What the rank holds (its q, k, v) plus the peak of what the call creates.
            nbytes = held + _peak_bytes(fns[name], device)
            peak = torch.tensor([nbytes], device=device, dtype=torch.float64)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # the largest rank
            row[f"{name}_s"], row[f"{name}_bytes"] = seconds, int(peak)
        rows.append(row)
    return rows


def _rank_main(rank: int, world: int, port: int, config: dict, results, measure) -> None:
    use_cuda = config["backend"] == "nccl"
    if not use_cuda and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # this process only: loopback
    torch.set_num_threads(config["threads"])
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=300)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group(
        config["backend"], store=store, rank=rank, world_size=world, timeout=timeout
    )
    try:
        rows = measure(rank, world, device, config)
        if rank == 0:
            for row in rows:
                results.put(row)
        dist.barrier()  # no rank tears the group down while another still uses it
    finally:
        dist.destroy_process_group()


def _run_world(world: int, config: dict, measure=measure_rank) -> list[dict]:
    """`measure(rank, world, device, config)` on `world` spawned ranks; rank 0's rows."""
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.start_processes(
        _rank_main,
        args=(world, store.port, config, results, measure),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    rows = []
    while not results.empty():
        rows.append(results.get())
    return rows


def run(
    *,
    world_sizes: tuple[int, ...] = (1, 2, 4),
    seq_lens: tuple[int, ...] = (1024, 2048, 4096, 8192),
    batch: int = 1,
    heads: int = 8,
    kv_heads: int | None = None,
    head_dim: int = 64,
    causal: bool = True,
    layout: str = "zigzag",
    backward: bool = False,
    block_size: int = 256,
    dtype: str = "float32",
    repeats: int = 5,
    threads: int = 1,
) -> str:
    """Measure ring attention at each world size and sequence length; return the table.

    Args:
        world_sizes: ranks per run (each run spawns that many processes).
        seq_lens: total sequence lengths T (each rank holds about T / P).
        batch, heads, kv_heads, head_dim: B, H, Hkv (default H), D.
        causal, layout, block_size: passed to `ring_attention` (tiles of 256 keep the per-tile
            scratch, about 2 x B*H*block_size^2 accumulator elements, below the O(T/P) part).
        backward: time and measure forward + backward (`out.sum().backward()`), not forward only.
        dtype: "float32", "float64", "bfloat16" or "float16".
        repeats: timed calls per point (after one warm-up); the median is reported.
        threads: torch threads per rank (default 1; the single-process peer gets the same).
            On a CPU the ranks share the cores: with more threads than free cores, OpenMP's
            waits dominate the many small tile ops (we measured 200x slowdowns on a loaded
            machine), so one thread per rank is the default.

    Uses NCCL with one GPU per rank when CUDA has at least max(world_sizes) GPUs, else gloo on
    CPU. A world of P = 1 also times `attention()` on the whole sequence (the peer).
    """
    rows: list[dict] = []
    config = dict(
        backend=backend_for(world_sizes), seq_lens=list(seq_lens), batch=batch,
        heads=heads, kv_heads=kv_heads or heads, head_dim=head_dim, causal=causal,
        layout=layout, backward=backward, block_size=block_size, dtype=dtype,
        repeats=repeats, threads=threads,
    )  # fmt: skip
    for world in world_sizes:
        rows += _run_world(world, config)
    return format_rows(rows, config)


def backend_for(world_sizes: tuple[int, ...]) -> str:
    """NCCL with one GPU per rank when CUDA has enough GPUs for the largest world, else gloo."""
    enough = torch.cuda.is_available() and torch.cuda.device_count() >= max(world_sizes)
    return "nccl" if enough else "gloo"


def format_rows(rows: list[dict], config: dict) -> str:
    """The table of `measure_rank` rows from every world, with a header saying what ran."""
    use_cuda = config["backend"] == "nccl"
    peer = {r["T"]: r for r in rows if "attention_s" in r}
    mib = 2**20
    lines = []
    for r in sorted(rows, key=lambda r: (r["T"], r["P"])):
        base = peer.get(r["T"])
        lines.append([
            str(r["T"]), str(r["P"]), str(r["T"] // r["P"]),
            f"{r['ring_bytes'] / mib:.2f}",
            f"{base['attention_bytes'] / mib:.2f}" if base else "-",
            f"{r['ring_s'] * 1e3:.1f}",
            f"{base['attention_s'] * 1e3:.1f}" if base else "-",
            f"{r['ring_s'] / base['attention_s']:.2f}" if base else "-",
        ])  # fmt: skip
    headers = ["T", "P", "T/P", "ring MiB/rank", "attention() MiB", "ring ms", "attention() ms",
               "ring / attention()"]  # fmt: skip
    device = torch.cuda.get_device_name(0) if use_cuda else "cpu"
    where = "cuda max_memory_allocated" if use_cuda else "peak bytes of live tensors created"
    where = f"q, k, v held + {where}"
    pass_ = "forward + backward" if config["backward"] else "forward"
    head = (
        f"ring attention ({pass_}, causal={config['causal']}, layout={config['layout']}, "
        f"B={config['batch']} H={config['heads']} Hkv={config['kv_heads']} "
        f"D={config['head_dim']} {config['dtype']}, block_size={config['block_size']})\n"
        f"torch {torch.__version__} | {config['backend']} on {device} | threads per rank: "
        f"{config['threads']} ({os.cpu_count()} cores) | memory: {where}, per rank | "
        f"time: median of {config['repeats']}, slowest rank"
    )
    return head + "\n" + format_table(headers, lines, left=())
