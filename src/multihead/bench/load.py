"""`multihead bench load`: loading a GGUF file, multihead vs transformers, each load in a fresh
process (a process's peak resident memory never goes down, and imports are paid once).

Each child process imports its library, records its resident memory (RSS), loads the model
in the dtype asked for, and reports the load's wall time (imports excluded), its peak RSS
(ru_maxrss) and the loaded model's size. Loads alternate between the two libraries, round
by round; the table gives medians and the ratios to transformers.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from ..table import format_table

# The child: argv = library, path, dtype; prints one JSON line.
_CHILD = r"""
import json, resource, sys, time
library, path, dtype_name = sys.argv[1:4]
import torch
dtype = getattr(torch, dtype_name)
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
if library == "multihead":
    from multihead.models import load_causal_lm
    from multihead.models import gguf  # noqa: F401  (the loader's imports, before the clock)
    load = lambda: load_causal_lm(path, dtype=dtype)
else:
    import os, transformers
    from transformers import AutoModelForCausalLM
    transformers.logging.disable_progress_bar()
    folder, name = os.path.split(path)
    load = lambda: AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
before = rss_mb()
start = time.perf_counter()
model = load()
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
size = sum(  # tied tensors counted once
{t.data_ptr(): t.numel() * t.element_size()
            for t in model.state_dict().values()}.values()) / 2**20
print(json.dumps(dict(seconds=seconds, before=before, peak=peak, size=size)))
"""

LIBRARIES = ("multihead", "transformers")
HEADERS = ["library", "dtype", "load s", "peak RSS MB", "RSS growth MB", "model MB", "growth/model"]
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def _child(library: str, path: Path, dtype: str) -> dict[str, float]:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, library, str(path), DTYPES[dtype]],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])[:400]
        raise RuntimeError(f"{library} could not load {str(path)!r} as {dtype}: {tail}")
    return json.loads(lines[-1])


def run(
    path: str | Path,
    *,
    dtypes: tuple[str, ...] = ("fp32", "bf16"),
    repeats: int = 1,
    peer: bool = True,
    progress=None,
) -> str:
    """The table for the GGUF file `path`. `peer=False` skips transformers (1-2 min a load
    on a small machine); `progress(message)` is told of each load before it starts."""
    file = Path(path)
    libraries = LIBRARIES if peer else LIBRARIES[:1]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(repeats):
        for dtype in dtypes:
            for library in libraries:
                if progress is not None:
                    progress(f"{library} {dtype}...")
                results.setdefault((library, dtype), []).append(_child(library, file, dtype))
    rows = []
    for (library, dtype), runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = statistics.median(r["peak"] for r in runs)
        growth = statistics.median(r["peak"] - r["before"] for r in runs)
        size = runs[0]["size"]
        cells = [f"{seconds:.2f}", f"{peak:.0f}", f"{growth:.0f}", f"{size:.1f}"]
        rows.append([library, dtype, *cells, f"{growth / size:.2f}x"])
    lines = [
        f"multihead bench load: {file.name} ({file.stat().st_size / 2**20:.0f} MB); each load "
        f"in a fresh process, medians of {repeats} run(s); python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cores",
        "",
        format_table(
            HEADERS,
            rows,
            left=(0, 1),
        ),
    ]
    if peer:
        lines.append("")
        for dtype in dtypes:
            ours, theirs = results[("multihead", dtype)], results[("transformers", dtype)]
            t = statistics.median(r["seconds"] for r in theirs) / statistics.median(
                r["seconds"] for r in ours
            )
            m = statistics.median(r["peak"] for r in theirs) / statistics.median(
                r["peak"] for r in ours
            )
            lines.append(f"{dtype}: multihead loads {t:.1f}x faster, {m:.1f}x less peak RSS")
    lines.append(
        "load s: the load call alone (imports excluded); RSS growth: peak RSS minus RSS just "
        "before the call (python, torch and the library already imported)"
    )
    return "\n".join(lines)
