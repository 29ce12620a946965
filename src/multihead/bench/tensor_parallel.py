"""`multihead bench parallel` (tensor parallelism): a CausalLM's per-rank parameter memory and
training step time at tp = 1, 2, 4, against the unsharded model in one process.

Each world is spawned like the ring benchmark's (gloo on CPU, or NCCL with one GPU per rank).
Memory: the bytes of the parameters a rank holds (local shards of DTensors), by part. Time: the
median over `repeats` steps (forward, cross-entropy, backward, SGD step) of the slowest rank;
the unsharded model (no DTensor, no collective) runs side by side in the world of one.

Shapes: token ids (B, T) replicated on every rank; logits (B, T, V).
"""

from __future__ import annotations

import copy
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from ..modules import CausalLM, LMConfig
from ..modules.attention import MultiHeadAttention
from ..modules.feedforward import FeedForward, SwiGLU
from ..table import format_table

PARTS = ("attention weights", "MLP weights", "attention and MLP biases", "other")


def parameter_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the parameters this rank holds, by part: the matrices of every
    MultiHeadAttention, those of every MLP (FeedForward, SwiGLU), their biases, and the rest
    (embeddings, norms, the LM head). A DTensor counts its local shard; a tied weight once."""
    owner: dict[int, str] = {}
    for module in model.modules():
        kind = (
            "attention"
            if isinstance(module, MultiHeadAttention)
            else "MLP"
            if isinstance(module, FeedForward | SwiGLU)
            else None
        )
        if kind is None:
            continue
        for p in module.parameters():
            owner.setdefault(id(p), kind)
    out = dict.fromkeys(PARTS, 0)
    for p in model.parameters():  # each parameter once
        local = p.to_local() if isinstance(p, DTensor) else p
        nbytes = local.numel() * local.element_size()
        kind = owner.get(id(p))
        if kind is None:
            out["other"] += nbytes
        elif local.dim() >= 2:
            out[f"{kind} weights"] += nbytes
        else:
            out["attention and MLP biases"] += nbytes
    return out


def _step(model: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    logits = model(ids[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    opt.step()


def measure_tp_rank(rank: int, world: int, device: torch.device, config: dict) -> list[dict]:
    """This rank's part in an initialised group of `world` ranks: one row (reduced over ranks)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ..parallel import tensor_parallel
    from .parallel import _timed

    lm = LMConfig(**config["model"])
    torch.manual_seed(0)
    unsharded = CausalLM(lm).to(device)
    model = tensor_parallel(copy.deepcopy(unsharded), init_device_mesh(device.type, (world,)))
    ids = torch.randint(lm.vocab_size, (config["batch"], config["seq_len"] + 1), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    fns = {"tp": lambda: _step(model, opt, ids)}
    if world == 1:
        opt_u = torch.optim.SGD(unsharded.parameters(), lr=1e-3)
        fns["unsharded"] = lambda: _step(unsharded, opt_u, ids)
    times = _timed(fns, device, config["repeats"])
    row: dict = {"tp": world, **{f"{k}_s": v for k, v in times.items()}}
    for part, nbytes in parameter_bytes(model).items():
        t = torch.tensor([nbytes], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the largest rank
        row[part] = int(t)
    if world == 1:
        row["unsharded bytes"] = parameter_bytes(unsharded)
    return [row]


def run_tensor_parallel(
    *,
    world_sizes: tuple[int, ...] = (1, 2, 4),
    dim: int = 256,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int | None = None,
    ffn_dim: int | None = None,
    vocab: int = 1024,
    batch: int = 4,
    seq_len: int = 128,
    mlp: str = "swiglu",
    repeats: int = 5,
    threads: int = 1,
) -> str:
    """Measure a CausalLM (RoPE) at each tensor-parallel size; return the table."""
    from .parallel import _run_world, backend_for

    backend = backend_for(world_sizes)
    model = dict(vocab_size=vocab, dim=dim, num_layers=layers, num_heads=heads,
                 num_kv_heads=kv_heads, ffn_dim=ffn_dim, position="rope", mlp=mlp,
                 norm="rmsnorm" if mlp == "swiglu" else "layernorm",
                 bias=mlp != "swiglu", max_positions=max(seq_len, 16))  # fmt: skip
    config = dict(backend=backend, model=model, batch=batch, seq_len=seq_len, repeats=repeats,
                  threads=threads)  # fmt: skip
    rows: list[dict] = []
    for world in world_sizes:
        rows += _run_world(world, config, measure_tp_rank)
    return format_tp_rows(rows, config)


def format_tp_rows(rows: list[dict], config: dict) -> str:
    mib = 2**20
    one = next((r for r in rows if r["tp"] == 1), None)
    unsharded = one["unsharded bytes"] if one else None
    lines = []
    if one is not None and unsharded is not None:
        lines.append(["unsharded", *(f"{unsharded[p] / mib:.2f}" for p in PARTS),
                      f"{sum(unsharded.values()) / mib:.2f}", "-",
                      f"{one['unsharded_s'] * 1e3:.1f}", "1.00"])  # fmt: skip
    for r in sorted(rows, key=lambda r: r["tp"]):
        total = sum(r[p] for p in PARTS)
        share = "-"
        if unsharded is not None:
            matrices = unsharded["attention weights"] + unsharded["MLP weights"]
            share = f"1/{matrices / (r['attention weights'] + r['MLP weights']):.2f}"
        ratio = f"{r['tp_s'] / one['unsharded_s']:.2f}" if one is not None else "-"
        lines.append([f"tp={r['tp']}", *(f"{r[p] / mib:.2f}" for p in PARTS),
                      f"{total / mib:.2f}", share, f"{r['tp_s'] * 1e3:.1f}", ratio])  # fmt: skip
    headers = ["model", "attention MiB", "MLP MiB", "biases MiB", "other MiB", "total MiB",
               "attn+MLP share", "step ms", "step / unsharded"]  # fmt: skip
    m = config["model"]
    use_cuda = config["backend"] == "nccl"
    device = torch.cuda.get_device_name(0) if use_cuda else "cpu"
    head = (
        f"tensor-parallel CausalLM training step (forward, cross-entropy, backward, SGD): "
        f"dim={m['dim']} layers={m['num_layers']} H={m['num_heads']} "
        f"Hkv={m['num_kv_heads'] or m['num_heads']} ffn={m['ffn_dim'] or 4 * m['dim']} "
        f"({m['mlp']}) vocab={m['vocab_size']}, B={config['batch']} T={config['seq_len']} "
        f"float32\ntorch {torch.__version__} | {config['backend']} on {device} | threads per "
        f"rank: {config['threads']} ({os.cpu_count()} cores) | memory: parameters held per "
        f"rank (largest rank; 'other' = embeddings, norms, LM head: replicated) | time: median "
        f"of {config['repeats']} steps, slowest rank"
    )
    return head + "\n" + format_table(headers, lines)
