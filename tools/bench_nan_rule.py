"""The cost of the NaN rule on the sdpa backend's unmasked fast path: attention(backend="sdpa")
with the correction (`sdpa._plain`) against the bare kernel call, interleaved in one process,
medians of 30 samples of 50 calls, 1 thread. Run: python tools/bench_nan_rule.py"""

import statistics
import time

import torch

from multihead.functional import attention
from multihead.functional.backends import sdpa

SHAPES = [(2, 4, 64, 64, 32, False), (2, 4, 64, 64, 32, True), (1, 8, 256, 256, 64, True),
          (8, 12, 1, 128, 64, False), (2, 4, 8, 8, 32, False)]  # fmt: skip


def bare(call, causal):  # the kernel alone: what _plain was before the rule
    q, k, v = call.q, call.k, call.v
    return sdpa._sdpa(
        q, k, v, dropout_p=call.dropout_p, is_causal=causal, scale=call.scale,
        enable_gqa=sdpa._gqa(q, k),
    )  # fmt: skip


def main() -> None:
    torch.set_num_threads(1)
    ruled = sdpa._plain
    print("B,H,Tq,Tk,D,causal: with the NaN rule / bare kernel (medians)")
    for B, H, tq, tk, D, causal in SHAPES:
        q = torch.randn(B, H, tq, D)
        k, v = torch.randn(B, H, tk, D), torch.randn(B, H, tk, D)
        times: dict[str, list[float]] = {"bare": [], "ruled": []}
        for _ in range(30):
            for name, fn in (("bare", bare), ("ruled", ruled)):
                sdpa._plain = fn
                start = time.perf_counter()
                for _ in range(50):
                    attention(q, k, v, causal=causal, backend="sdpa")
                times[name].append((time.perf_counter() - start) / 50)
        sdpa._plain = ruled
        b, r = statistics.median(times["bare"]), statistics.median(times["ruled"])
        print(f"{B},{H},{tq},{tk},{D},{causal}: {r / b:.3f}x ({b * 1e6:.0f} us bare)")


if __name__ == "__main__":
    main()
