"""`multihead bench attention-memory`: peak memory of one MultiHeadAttention call at a long
sequence with a key mask, with `causal=True`, and with both. Together they must not build a
(T, T) mask: the memory of "both" should stay near that of either alone (O(T), not O(T^2)).

Each case runs in a fresh Python process (peak RSS counts everything a process ever held, so
cases cannot share one); on CUDA the peak comes from torch's allocator instead.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ..table import format_table

CASES = ("key mask", "causal", "key mask + causal")

# The child: builds the module, runs one eval call, prints its peak memory growth as JSON.
_CHILD = """
import json, resource, sys, torch
from multihead import MultiHeadAttention
T, E, H = (int(a) for a in sys.argv[1:4])
case, device, dtype = sys.argv[4], sys.argv[5], getattr(torch, sys.argv[6])
torch.manual_seed(0)
m = MultiHeadAttention(E, H, causal="causal" in case, device=device, dtype=dtype).eval()
x = torch.randn(1, T, E, device=device, dtype=dtype)
key_mask = torch.ones(1, T, dtype=torch.bool, device=device)
key_mask[0, :7] = False  # left padding: a real mask, some keys blocked
cuda = device.startswith("cuda")
if cuda:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
else:
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with torch.no_grad():
    out = m(x, key_mask=key_mask if "key mask" in case else None)
if cuda:
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
else:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps({"bytes": peak, "finite": bool(torch.isfinite(out).all())}))
"""


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def measure(T: int, E: int, H: int, case: str, device: str, dtype: str) -> dict:
    """One case in a fresh process: {"bytes": peak growth, "finite": all outputs finite}."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(T), str(E), str(H), case, device, DTYPES[dtype]],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {case!r} case failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(
    lengths=(8192, 32768), E: int = 512, H: int = 8, device: str = "cpu", dtype: str = "fp32"
) -> str:
    if E % H:
        raise ValueError(f"embed_dim {E} must be divisible by the {H} heads")
    rows = []
    for T in lengths:
        results = {case: measure(T, E, H, case, device, dtype) for case in CASES}
        gib = {case: r["bytes"] / 2**30 for case, r in results.items()}
        square = T * T / 2**30  # a (T, T) boolean mask, in GiB
        rows.append(
            [str(T)]
            + [f"{gib[c]:.2f}" for c in CASES]
            + [f"{square:.2f}", "yes" if all(r["finite"] for r in results.values()) else "NO"]
        )
    what = "peak RSS growth" if not device.startswith("cuda") else "peak CUDA allocation"
    headers = ["T"] + [f"{c} GiB" for c in CASES] + ["one (T, T) bool mask GiB", "finite"]
    return "\n".join(
        [
            f"multihead bench attention-memory: one eval call of MultiHeadAttention({E}, {H}) "
            f"at (1, T, {E}), {dtype}, on {device}: {what} in a fresh process per case",
            "",
            format_table(headers, rows),
        ]
    )
