"""The module's structured self-attention moves no whole tensor between its projections and the
tiled backend (issue 41: the module within 1.2x of its projection-aware ideal): q, k, v reach
the backend as views of the blocked projection's buffer, their gradients come back written
into one buffer, and the out-projection reads the backend's (B, T, H, Dv) output in place, in
the forward and the backward. Measured (torch.profiler, one thread, window 256 at T 4096):
the structured module's fwd + bwd costs its projections plus the function alone, within noise.

Watched with a dispatch mode (which also makes the tiled backend run inline): every copy-like
op (copy_, clone, cat, _to_copy) and the size of the floating tensor it writes; none may write
as much as a whole (B, T, C) tensor. The backend's own kernels copy blocks smaller than that."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from multihead import MultiHeadAttention
from multihead.functional.backends import tiled

COPIES = ("copy_", "clone", "cat", "_to_copy", "contiguous", "index_copy", "index_put_")


class _Copies(TorchDispatchMode):
    """Records (op name, elements written) of every copy-like op run inside it."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in COPIES:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            sizes = [
                o.numel() for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()
            ]
            written = max(sizes, default=0)  # (a mask the call classifies is not data moved)
            self.seen.append((name, written))
        return out


def _args(kind: str, B: int, T: int) -> dict:
    if kind == "window":
        return {"window": 100}
    if kind == "prefix":
        return {"prefix": 250}
    ids = torch.zeros(B, T, dtype=torch.long)  # (B, T): three documents, one per row different
    ids[:, 300:] = 1
    ids[1, 700:] = 2
    if kind == "documents":
        return {"documents": ids}

    def windowed_documents(b, h, q_idx, kv_idx):  # general: documents with a window inside
        same = ids[b, q_idx] == ids[b, kv_idx]
        return (kv_idx <= q_idx) & (q_idx - kv_idx < 64) & same

    return {"mask_mod": windowed_documents}


@pytest.mark.parametrize("kv_heads", [6, 2])
@pytest.mark.parametrize("kind", ["window", "documents", "prefix", "general"])
def test_no_whole_tensor_is_copied_around_the_structured_call(threads, kind, kv_heads, monkeypatch):
    torch.manual_seed(0)
    B, T, C = 2, 1031, 48  # (odd T; 6 heads of 8)
    m = MultiHeadAttention(C, 6, num_kv_heads=kv_heads, causal=True)
    x = torch.randn(B, T, C, requires_grad=True)
    args = _args(kind, B, T)
    packed = []
    views = tiled.packed_views

    def record(q, k, v):
        found = views(q, k, v)
        packed.append(found is not None and found.covers)
        return found

    monkeypatch.setattr(tiled, "packed_views", record)
    g = torch.randn(B, T, C)
    spy = _Copies()
    with spy:
        out = m(x, **args)
        out.backward(g)
    assert packed == [True]  # q, k, v: views of one buffer that the gradient fills in place
    whole = B * T * C
    assert [(name, n) for name, n in spy.seen if n >= whole] == []
    # (the same call without the spy: what it computes is what the dense mask gives, see
    # test_module_blocked_projection; here only that the spy changed nothing)
    x2 = x.detach().clone().requires_grad_()
    again = m(x2, **args)
    again.backward(g)
    torch.testing.assert_close(again, out)
    torch.testing.assert_close(x2.grad, x.grad)
