"""The tiled backend's work spread over worker threads that each run torch single-threaded.

Why: torch runs each CPU kernel call above a small size as an OpenMP parallel region that
ends when every thread has finished its static share. The tiled paths make many such calls
(kernel calls per block chunk, copies, adds, fills), and beside another busy process a
thread of ours is often descheduled: every region then waits for it. Measured, window 256 at
T 4096, forward + backward, 2 threads beside a process running matmuls on both cores: the
copies, adds and fills of ~2 MB took ~26 ms each (0.2 ms alone), the call 25x its ideal.
Here the work is cut into independent units (the fast paths: a batch row and a group of kv
heads, `head_units`; the general tile plan: a run of consecutive query blocks, `row_groups`,
whose key gradients gather in buffers of the unit's own: every tensor a unit writes is its
own) and the units go to `torch.get_num_threads()` workers that
each run torch with one thread: no kernel call is a parallel region, a descheduled worker
holds up only its own unit, and the others take the remaining units from the queue. The
calling thread waits (the GIL is released inside torch's kernels, so the workers' kernels run
at once; their Python runs one at a time, a small share of a unit).

The workers' one thread: `torch.set_num_threads(1)` inside each worker, once, when the pool is
made. In torch that also stores the count that threads started later take as their default,
so the pool then stores back what a fresh thread saw before (a brief, one-time window in which
another thread that starts using torch, or calls `torch.set_num_threads`, could see or lose a
count: pools are made once per process and worker count). Nothing is changed per call, and
the calling thread's own count is never touched.

Runs inline instead (in the calling thread, torch's own threads, as before) when one thread
is asked for, there is one unit, or the call could see the difference: autograd recording
(grad mode on, e.g. a backward under create_graph), a torch function or dispatch mode
(FlopCounterMode, a default device), tensor subclasses (not a Parameter: it runs as a
Tensor), or a call from a worker itself; and a fast path's small call on a machine whose
cores are free (`per_call`, a probe per call).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

_lock = threading.Lock()
_pools: dict[int, _Pool] = {}
_pid = os.getpid()
_local = threading.local()  # .worker: this thread is one of ours
# The per-call choices of this context, while `recorded_choices` is open (else None)
_choices: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "multihead_tile_choices", default=None
)


class _Batch:
    """One call's units: how many are left, the first error, and a condition to wait on."""

    def __init__(self, n: int):
        self.left = n
        self.cond = threading.Condition()
        self.error: BaseException | None = None

    def done(self, error: BaseException | None) -> None:
        with self.cond:
            self.left -= 1
            if error is not None and self.error is None:
                self.error = error
            if self.left == 0:
                self.cond.notify_all()

    def wait(self) -> None:
        with self.cond:
            while self.left:
                self.cond.wait()
        if self.error is not None:
            raise self.error


class _Pool:
    """`size` daemon threads taking (context, fn, inference mode, batch) from one queue."""

    def __init__(self, size: int):
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        ready = threading.Barrier(size + 1)
        for i in range(size):
            name = f"multihead-tiles-{i}"
            threading.Thread(target=self._loop, args=(ready,), name=name, daemon=True).start()
        ready.wait()

    def _loop(self, ready: threading.Barrier) -> None:
        _local.worker = True
        # torch sets a thread's count on its first use, from the default that the pool then
        # stores back: that first use comes before ours, or it would undo it
        torch.get_num_threads()
        torch.set_num_threads(1)  # this thread's kernels: no parallel regions
        ready.wait()
        while True:
            context, fn, inference, batch = self.tasks.get()
            error = None
            try:
                with torch.inference_mode(inference), torch.no_grad():
                    context.run(fn)
            except BaseException as e:  # handed to the caller, raised there
                error = e
            # Let go of the unit before reporting it done: it holds views of the caller's
            # tensors (a backward's gradients), and a reference kept here until the next unit
            # makes autograd copy that gradient into .grad instead of taking it (it takes only
            # a gradient nothing else holds): three 2 MB copies a (1, 8, 1024, 64) call
            del fn, context
            batch.done(error)


def _fresh_thread_count() -> int:
    """What a thread that starts using torch now gets as its thread count."""
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


def _pool(size: int) -> _Pool:
    global _pid
    with _lock:
        if os.getpid() != _pid:  # a forked child: the parent's threads are not here
            _pools.clear()
            _pid = os.getpid()
        pool = _pools.get(size)
        if pool is None:
            default = _fresh_thread_count()
            pool = _pools[size] = _Pool(size)
            # store back the default for threads started later (set from a thread of its
            # own, which ends here: no running thread's count changes)
            t = threading.Thread(target=torch.set_num_threads, args=(default,))
            t.start()
            t.join()
        return pool


def workers(*tensors: Tensor | None) -> int:
    """How many workers a call's units may use: the calling thread's torch thread count, or 1
    where the units must run inline (see the module docstring)."""
    if getattr(_local, "worker", False) or torch.is_grad_enabled():
        return 1
    if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        return 1
    if any(t is not None and type(t) not in PLAIN for t in tensors):
        return 1
    return torch.get_num_threads()


# Tensors whose kernels are torch's own: a Parameter (a module's weight) runs as a Tensor, its
# __torch_function__ disabled; any other subclass may redirect a call, so it stays inline
PLAIN = (Tensor, torch.nn.Parameter)


# Below this many (query, key) pairs of the whole call (batch x heads x queries x keys, as if
# dense), a fast path's units run inline when the machine's cores are free (`per_call`).
SMALL_PAIRS = 1 << 26


def per_call(n: int, pairs: int) -> int:
    """The per-call thread choice of a fast path (issue 41): 1 (inline: the calling thread,
    torch's own n threads) for a call of fewer than SMALL_PAIRS pairs while the machine runs no
    more runnable threads than n and its cores (this one included: a probe per call of
    /proc/loadavg's count, ~20 us), else n (the workers).

    Why: after the caller's last parallel region (a module's projection GEMM) libgomp's helper
    thread spins ~3 ms on a core, and the workers' units start that much late; inline, torch's
    own threads take the next region at once. Measured idle, the module's window-256 call at
    T 1024 and two threads: workers 1.35x-1.39x of its ideal, inline 1.20x-1.23x; but inline
    beside a busy process 1.95x-3.06x (each region waits for a descheduled thread), where the
    workers read 1.17x-1.30x. Where the count cannot be read (not Linux), the workers."""
    chosen = 1 if n > 1 and pairs < SMALL_PAIRS and cores_free(n) else n
    seen = _choices.get()
    if seen is not None:
        seen.append(chosen)
    return chosen


def cores_free(n: int) -> bool:
    """Whether the machine runs no more runnable threads now than n and its cores (this one
    included; a probe of /proc/loadavg's count, ~20 us): no other busy process. False where
    the count cannot be read (not Linux)."""
    running = _runnable()
    return running is not None and running <= min(n, _cores())


@contextlib.contextmanager
def recorded_choices() -> Iterator[list[int]]:
    """Within the block, the thread count `per_call` chose for each fast-path call (forward
    and backward) made in this context, in order: 1 where the call ran inline, else its
    workers. For the benchmark, to check the choice in each condition (issue 41); nothing
    is recorded outside the block."""
    seen: list[int] = []
    token = _choices.set(seen)
    try:
        yield seen
    finally:
        _choices.reset(token)


def _runnable() -> int | None:
    """The machine's runnable threads now (the 4th field of /proc/loadavg: "running/total"),
    None where it cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run(units: Sequence[Callable[[], object]], n: int) -> None:
    """Run the units (each writing tensors no other unit touches) on n workers, or inline
    when n <= 1 or there is one unit; return when all are done, raising the first error."""
    if n <= 1 or len(units) <= 1:
        for unit in units:
            unit()
        return
    pool = _pool(n)
    batch = _Batch(len(units))
    inference = torch.is_inference_mode_enabled()
    for unit in units:
        pool.tasks.put((contextvars.copy_context(), unit, inference, batch))
    batch.wait()


def head_units(B: int, H: int, Hkv: int, n: int) -> list[tuple[slice, slice, slice]]:
    """(batch rows, query heads, kv heads) of each unit: groups of whole kv heads (their
    query heads with them) of one batch row, about 2 n units in all (a descheduled worker's
    share is taken up by the others); for n = 1 one unit of everything."""
    if n <= 1:
        return [(slice(None), slice(None), slice(None))]
    G = H // Hkv
    per = min(Hkv, max(1, (B * Hkv) // (2 * n)))
    return [
        (slice(b, b + 1), slice(g * G, min(Hkv, g + per) * G), slice(g, min(Hkv, g + per)))
        for b in range(B)
        for g in range(0, Hkv, per)
    ]


def row_groups(weights: list[int], n: int) -> list[range]:
    """Contiguous runs of indices (a general plan's query blocks) of about equal total weight
    (the pairs their tiles compute), about 2 n of them, none empty; for n = 1 one run of all."""
    count = len(weights)
    if n <= 1 or count <= 1:
        return [range(count)]
    parts = min(count, 2 * n)
    if not any(weights):
        weights = [1] * count
    total = sum(weights)
    groups: list[range] = []
    start, acc = 0, 0
    for i, w in enumerate(weights[:-1]):
        acc += w
        left = parts - 1 - len(groups)  # runs still to close after the current one
        # close the run once it holds its share, or when each run to come needs its index
        if left and (acc * parts >= total * (len(groups) + 1) or count - (i + 1) == left):
            groups.append(range(start, i + 1))
            start = i + 1
    groups.append(range(start, count))
    return groups
