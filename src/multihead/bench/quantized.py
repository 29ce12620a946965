"""Quantized GGUF models: decoding side by side (`multihead bench decode --model F.gguf`) and
an 8B-shaped load in bounded memory (`multihead bench load --shape llama3-8b`).

Decode: one fresh process per engine and round, engines alternating round by round (this
machine is shared, so absolute times drift; the table gives medians of per-round ratios to
the dequantised float32 model measured in the same round). Each child loads the file, sets
the thread count, times a prefill of `prefill` tokens (the last position's logits; the
median of three, after one of that length) and a greedy decode of `new` tokens after a
`prompt`-token prompt, and prints one JSON line. `prefill_only` (`--prefill-only`) leaves the
decoding out and times five prefills per child, so more rounds fit the same time; its table
gives the range of the per-round ratios, which says whether a difference is beyond the noise.
Engines: "quantized" (multihead, packed weights, float32 activations), "fp32" (multihead,
`quantized=False`), "llama.cpp" (llama-cpp-python, only when asked: `--peer llama.cpp`).

llama.cpp runs with its model parameter `use_extra_bufts` off unless `repack=True`: the extra
buffer types repack weights for AMX / other CPU kernels at load, and on a CPU that reports AMX
inside a VM that does not run it (this machine) llama-cpp-python 0.3.36 dies with SIGSEGV in
ggml_backend_amx_mul_mat. With them off llama.cpp uses its ordinary CPU kernels (AVX-512 /
VNNI on the file's blocks, activations quantised to 8 bits as llama.cpp always does).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..table import format_table

_DECODE_CHILD = r"""
import json, sys, time
engine, path, threads, prompt, new, prefill, repack, repeats = sys.argv[1:9]
threads, prompt, new, prefill = int(threads), int(prompt), int(new), int(prefill)
repeats = int(repeats)  # prefill timings (their median); 0: the prefill only, 5 timings
import numpy as np
rng = np.random.default_rng(0)
if engine == "llama.cpp":
    import llama_cpp
    import llama_cpp.llama
    if repack == "0":  # no extra buffer types: llama.cpp's CPU weight repacking (AMX) off
        defaults = llama_cpp.llama_model_default_params
        def no_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params
        llama_cpp.llama.llama_cpp.llama_model_default_params = no_extra_bufts
    llm = llama_cpp.Llama(path, n_threads=threads, n_threads_batch=threads, n_ctx=1024,
                          n_batch=512, verbose=False)
    vocab = llm.n_vocab()
    def greedy(ids, n):
        llm.reset()
        llm.eval(ids)
        out = []
        for _ in range(n):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(tok)
            llm.eval([tok])
        return out
    def run_prefill(ids):
        llm.reset(); llm.eval(ids)
else:
    import torch
    torch.set_num_threads(threads)
    import multihead
    kind, _, compiled = engine.partition(" ")
    model = multihead.load(path, quantized=kind == "quantized")
    vocab = model.config.vocab_size
    def greedy(ids, n):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), n, compile=bool(compiled))
            return out[0, len(ids):].tolist()
    def run_prefill(ids):
        if compiled:  # (the prefill is timed eager, in the uncompiled rows)
            return
        with torch.no_grad():
            model(torch.tensor([ids]), last_only=True)
isa = ""
if engine.startswith("quantized"):
    from multihead.modules.quantized import kernels
    isa = kernels.kernel_isa() or "none (torch)"
prompt_ids = rng.integers(100, vocab - 100, prompt).tolist()
prefill_ids = rng.integers(100, vocab - 100, prefill).tolist()
tps, tokens = 0.0, []
if repeats:  # (0: the prefill only)
    greedy(prompt_ids, 2)  # warm up
    if engine.endswith("compiled"):  # compiled: each cache length timed below compiles first
        greedy(prompt_ids, 1)
        greedy(prompt_ids, new)
    t = time.perf_counter(); greedy(prompt_ids, 1); first = time.perf_counter() - t
    t = time.perf_counter(); tokens = greedy(prompt_ids, new); total = time.perf_counter() - t
    tps = (new - 1) / max(1e-9, total - first)
run_prefill(prefill_ids)  # warm up at the full length (allocations), then the median
pres = []
for _ in range(repeats or 5):
    t = time.perf_counter(); run_prefill(prefill_ids); pres.append(time.perf_counter() - t)
pre = sorted(pres)[len(pres) // 2]
print(json.dumps(dict(decode_tps=tps, prefill_s=pre, tokens=tokens[:8], isa=isa)))
"""

ENGINES = ("quantized", "fp32")
COMPILED = ("quantized compiled", "fp32 compiled")  # generate(compile=True): inductor


def _child(
    engine: str,
    path: Path,
    threads: int,
    prompt: int,
    new: int,
    prefill: int,
    python: str,
    repack: bool = False,
    repeats: int = 3,
) -> dict:
    done = subprocess.run(
        [python, "-c", _DECODE_CHILD, engine, str(path), str(threads), str(prompt),
         str(new), str(prefill), "1" if repack else "0", str(repeats)],
        capture_output=True, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the {engine} process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def decode(
    path: Path,
    *,
    threads: int = 2,
    prompt: int = 32,
    new: int = 64,
    prefill: int = 512,
    rounds: int = 3,
    peer: str | None = None,
    python: str | None = None,
    repack: bool = False,
    compiled: bool = False,
    prefill_only: bool = False,
) -> str:
    """The side-by-side table (see the module docstring); `compiled` adds both multihead
    engines under `generate(compile=True)` (decode only: their prefill is the eager one);
    `prefill_only`: no decoding, each child times 5 prefills (the median), and the table
    gives the per-round ratios' range beside their median."""
    if prefill_only:
        compiled = False
    engines = [*ENGINES, *(COMPILED if compiled else ()), *([peer] if peer else [])]
    rows: dict[str, list[dict]] = {e: [] for e in engines}
    repeats = 0 if prefill_only else 3
    for r in range(rounds):
        order = engines if r % 2 == 0 else engines[::-1]  # alternate who runs first
        for engine in order:
            exe = (python or sys.executable) if engine == peer else sys.executable
            rows[engine].append(
                _child(engine, path, threads, prompt, new, prefill, exe, repack, repeats)
            )
    if prefill_only:
        return _prefill_table(path, rows, prefill, threads, rounds, peer is not None and not repack)
    base = rows["fp32"]
    table = []
    for engine in engines:
        tps = [x["decode_tps"] for x in rows[engine]]
        pre = [x["prefill_s"] for x in rows[engine]]
        eager = engine not in COMPILED
        table.append([
            engine,
            f"{statistics.median(tps):.1f}",
            f"{statistics.median(t / b['decode_tps'] for t, b in zip(tps, base, strict=True)):.2f}x",  # noqa: E501
            f"{statistics.median(pre) * 1e3:.0f}" if eager else "-",
            f"{statistics.median(p / b['prefill_s'] for p, b in zip(pre, base, strict=True)):.2f}x"
            if eager else "-",
            "same" if rows[engine][0]["tokens"] == base[0]["tokens"] else "differ",
        ])  # fmt: skip
    head = _title(
        path,
        f"greedy decode of {new} tokens after a {prompt}-token prompt; prefill of {prefill} "
        f"tokens; {threads} threads",
        f"{rounds} rounds, engines alternating, one process each",
        rows,
        "medians, ratios per round to fp32",
        bool(peer) and not repack,
    )
    headers = ["engine", "decode tok/s", "vs fp32", f"prefill {prefill} ms", "vs fp32", "tokens"]
    return head + format_table(headers, table)


def _prefill_table(
    path: Path,
    rows: dict[str, list[dict]],
    prefill: int,
    threads: int,
    rounds: int,
    no_repack: bool,
) -> str:
    """`decode(prefill_only=True)`'s table: per engine the median prefill time, the median of
    the per-round ratios to fp32 and their range (lowest - highest)."""
    base = rows["fp32"]
    table = []
    for engine, runs in rows.items():
        pre = [x["prefill_s"] for x in runs]
        ratios = sorted(p / b["prefill_s"] for p, b in zip(pre, base, strict=True))
        table.append([
            engine,
            f"{statistics.median(pre) * 1e3:.0f}",
            f"{statistics.median(ratios):.3f}x",
            f"{ratios[0]:.3f} - {ratios[-1]:.3f}",
        ])  # fmt: skip
    head = _title(
        path,
        f"prefill of {prefill} tokens (the last position's logits), no decoding; {threads} threads",
        f"{rounds} rounds, engines alternating, one process each, the median of 5 prefills per "
        "process",
        rows,
        "ratios per round to fp32",
        no_repack,
    )
    headers = ["engine", f"prefill {prefill} ms", "vs fp32 (median)", "vs fp32 (range)"]
    return head + format_table(headers, table)


def _title(
    path: Path, what: str, runs: str, rows: dict[str, list[dict]], figures: str, no_repack: bool
) -> str:
    """The first line of both tables: the file, what was timed, how, torch, the packed
    kernel's vector path and what the figures are."""
    import torch

    return (
        f"{path.name}: {what}; {runs}; torch {torch.__version__}; packed kernel: "
        f"{rows['quantized'][0]['isa']}; {figures}"
        + ("; llama.cpp without weight repacking (use_extra_bufts off)" if no_repack else "")
        + "\n"
    )


# -- load an 8B-shaped Q4_0 file in bounded memory ------------------------------------------

LLAMA3_8B = dict(
    dim=4096, ffn=14336, layers=32, heads=32, kv_heads=8, vocab=128256, positions=8192
)  # fmt: skip

_LOAD_CHILD = r"""
import json, resource, sys, time
path, tokens = sys.argv[1], int(sys.argv[2])
import torch
import multihead
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30
def peak_gib():  # VmHWM: ru_maxrss keeps a forking parent's peak across exec
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 2**20
before = rss()
t = time.perf_counter(); model = multihead.load(path); load_s = time.perf_counter() - t
after_load = rss()
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g)
t = time.perf_counter()
with torch.no_grad():  # inspection: no autograd graph (with one, 8B peaks ~2.8 GiB higher)
    logits, cache = model.run_with_cache(ids)
run_s = time.perf_counter() - t
finite = bool(torch.isfinite(logits).all())
print(json.dumps(dict(load_s=load_s, run_s=run_s, before=before, after_load=after_load,
                      peak=peak_gib(),
                      hooks=len(cache.keys()), finite=finite)))
"""


def write_random_q4_0(path: Path, shape: dict, seed: int = 0) -> int:
    """A Llama-shaped GGUF of random Q4_0 matrices (norms F32), written block row by block row
    so the writer never holds a whole float matrix; returns its size in bytes."""
    import gguf
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(seed)
    C, F, L, H, Hkv, V = (shape[k] for k in ("dim", "ffn", "layers", "heads", "kv_heads", "vocab"))
    D = C // H
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(L)
    w.add_context_length(shape["positions"])
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    block, size = GGML_QUANT_SIZES[Q.Q4_0]
    matrices = {"token_embd.weight": (V, C), "output.weight": (V, C)}
    norms = {"output_norm.weight": C}
    for i in range(L):
        matrices.update({
            f"blk.{i}.attn_q.weight": (H * D, C), f"blk.{i}.attn_k.weight": (Hkv * D, C),
            f"blk.{i}.attn_v.weight": (Hkv * D, C), f"blk.{i}.attn_output.weight": (C, H * D),
            f"blk.{i}.ffn_gate.weight": (F, C), f"blk.{i}.ffn_up.weight": (F, C),
            f"blk.{i}.ffn_down.weight": (C, F),
        })  # fmt: skip
        norms.update({f"blk.{i}.attn_norm.weight": C, f"blk.{i}.ffn_norm.weight": C})
    for name, (rows, cols) in matrices.items():
        nbytes = rows * cols // block * size
        w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), nbytes, Q.Q4_0)
    for name, n in norms.items():
        w.add_tensor_info(name, (n,), np.dtype(np.float32), n * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]  # (the data, streamed in the infos' order)
    scale = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
    for rows, cols in matrices.values():
        w.write_padding(fout, fout.tell())
        for start in range(0, rows, 1024):  # 1024 rows of blocks at a time
            n = min(1024, rows - start)
            raw = rng.integers(0, 256, (n, cols // block, size), dtype=np.uint8)
            raw[:, :, 0:2] = scale
            raw.tofile(fout)
    for n in norms.values():
        w.write_padding(fout, fout.tell())
        np.ones(n, np.float32).tofile(fout)
    fout.flush()
    w.close()
    return path.stat().st_size


def load_shape(shape_name: str = "llama3-8b", tokens: int = 128, folder: str | None = None) -> str:
    shape = {"llama3-8b": LLAMA3_8B}[shape_name]
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        path = Path(tmp) / f"random-{shape_name}-Q4_0.gguf"
        size = write_random_q4_0(path, shape)
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_CHILD, str(path), str(tokens)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the load process failed:\n{done.stderr[-2000:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [[
        f"{size / 2**30:.2f}", f"{r['load_s']:.0f}", f"{r['after_load']:.2f}",
        f"{r['run_s']:.1f}", f"{r['peak']:.2f}", str(r["hooks"]), str(r["finite"]),
    ]]  # fmt: skip
    headers = ["file GiB", "load s", "RSS after load GiB", f"run_with_cache {tokens} s",
               "peak RSS GiB", "hooks", "finite"]  # fmt: skip
    title = f"random {shape_name}-shaped Q4_0 GGUF (written, loaded, deleted); run_with_cache "
    title += "under torch.no_grad()\n"
    return title + format_table(headers, rows)
