"""Generation for `CausalLM`: a prefill of the prompts, then one token per step from KV caches.

Eager (default): preallocated `KVCache`s that hand out the keys cached so far.
`compile=True`: `StaticKVCache`s (fixed shapes, written at index tensors); the prefill is
compiled once with `torch.compile(fullgraph=True)` (dynamic in the prompt length), the decode
step once per (batch size, cache length) with static shapes (`_step_for`), and on CUDA the
decode step runs as a CUDA graph (mode "reduce-overhead"). Later calls with the same batch
size and cache length reuse the code.

Sampling stays on the device: nothing is read on the host per token, except to check `eos`,
read once every `eos_check_every` steps (tokens are held back until the check, so the output
does not depend on it). The inputs are checked once per call. The model is left exactly as it
was: nothing is written to it (the head is read through a temporary copy where another memory
layout is faster).

Shapes: prompt_ids (B, P); attention_mask (B, P); logits (B, V); tokens (B,).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import masks
from ..hook_points import hooks_for, observed
from ..value_checks import check_token_ids
from .sampling import check_sampling, sample
from .step_key import model_key

if TYPE_CHECKING:
    from torch import nn

    from .cache import KVCache
    from .static_cache import StaticKVCache

    Caches = Sequence[KVCache | StaticKVCache]


class CausalLM(Protocol):
    """What generation reads of a model (`modules.lm.CausalLM` is the one that ships): its
    config, its head, its caches and its final hidden states. A protocol rather than an import
    of the class, which itself imports this module for its `generate` methods."""

    config: Any
    head: nn.Linear

    def make_caches(
        self, batch_size: int, max_length: int | None = None, *, static: bool = False
    ) -> Any: ...

    def hidden_states(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        caches: Caches | None = None,
        positions: Tensor | None = None,
        last_only: bool = False,
    ) -> Tensor: ...


# Below this many new tokens, a re-laid-out copy of the head costs more than it saves.
MIN_STEPS_FOR_HEAD_COPY = 32
# Static caches are sized up to a multiple of this, so calls of similar lengths share shapes.
STATIC_CACHE_BUCKET = 64
# at::internal::GRAIN_SIZE: eager CPU ops run single-threaded below this many elements.
ATEN_GRAIN_SIZE = 32768
# The compiled decode step's guard filter: no guards on the model's modules (see
# `_compile_args`; `_step_for` keys the step by the model's structure instead).
# (torch 2.7 and later; None: all guards, as before.)
STEP_GUARDS = getattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe", None)


def soft_cap(logits: Tensor, cap: float | None) -> Tensor:
    """Final-logit soft-capping `tanh(logits / cap) * cap` (Gemma 2); None: unchanged."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


def head_logits(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """(..., C) -> (..., V) through a (V, C) head weight of either memory layout.

    On CPU, several rows against a row-major weight run as mm(W, h^T): MKL multiplies 2-8 rows
    that way 1.5-9x faster than as h W^T (GPT-2's head, measured here)."""
    flat = h.reshape(-1, h.shape[-1])
    if (
        flat.shape[0] > 1
        and weight.device.type == "cpu"
        and weight.is_contiguous()
        and bias is None
    ):
        return torch.mm(weight, flat.T).T.reshape(
            *h.shape[:-1], weight.shape[0]
        )  # (V, N) -> (N, V)
    return F.linear(h, weight, bias)


def head_copy_for(model: CausalLM, rows: int, steps: int) -> Tensor | None:
    """A copy of the head weight for the decode steps to read, or None to read the weight
    itself: on CPU at one row per step, a column-major copy (MKL streams it faster: GPT-2's
    head 6.1 ms vs 10.7 per step), made for this call only so the model is not touched.
    (None elsewhere also keeps the parameter a static input of a CUDA graph: an argument
    tensor would be copied into the graph at every replay.)"""
    if not isinstance(model.head, nn.Linear):  # a packed head reads its own storage
        return None
    w = model.head.weight
    if (
        w.device.type == "cpu"
        and rows == 1
        and steps >= MIN_STEPS_FOR_HEAD_COPY
        and w.is_contiguous()
        and w.shape[0] > 1
    ):
        return w.detach().t().contiguous().t()
    return None


def _logits(model: CausalLM, h: Tensor, head: Tensor | None) -> Tensor:
    """Hidden states (B, T, C) -> the last position's logits (B, V). Under hooks, every
    position's logits pass `hook_logits` first, as in `CausalLM.forward`, so a cache around
    `generate` holds them by position like the other hook points."""
    hooks = hooks_for(model)
    cap = model.config.final_softcap
    rows = h[:, -1] if hooks is None else h
    if head is None and not isinstance(model.head, nn.Linear):  # packed: its own product
        logits = model.head(rows)
    else:
        weight = model.head.weight if head is None else head
        logits = head_logits(rows, weight, model.head.bias)
    logits = soft_cap(logits, cap)
    return logits if hooks is None else hooks("hook_logits", logits)[:, -1]


def _prefill(
    model: CausalLM,
    ids: Tensor,
    attention_mask: Tensor | None,
    positions: Tensor | None,
    caches: Caches,
    head: Tensor | None,
) -> Tensor:
    """Fill the caches with the prompts (B, P); the logits (B, V) of the last position.
    Under hooks every position goes through the final norm, so that hook shows the prompt's
    positions as the other hook points do (see `hooked.steps`)."""
    h = model.hidden_states(
        ids,
        attention_mask=attention_mask,
        caches=caches,
        positions=positions,
        last_only=not observed(model),
    )
    return _logits(model, h, head)


def _decode(
    model: CausalLM, token: Tensor, positions: Tensor, caches: Caches, head: Tensor | None
) -> Tensor:
    """One step: tokens (B, 1) at positions (B, 1) -> logits (B, V)."""
    h = model.hidden_states(token, caches=caches, positions=positions, last_only=True)
    return _logits(model, h, head)


def _compile_args(options: bool | dict[str, Any], device: torch.device, step: bool) -> dict:
    """torch.compile's arguments for the prefill (`step=False`: dynamic prompt length) or the
    decode step (static shapes: each batch size and cache length, a multiple of
    STATIC_CACHE_BUCKET, compiles its own step (`_step_for`); with torch's default, automatic
    dynamic shapes, the second length compiled a step symbolic in the cache length, slower per
    token than the static ones (docs/performance.md)).

    With inductor (the default): on CUDA the step runs as a CUDA graph ("reduce-overhead");
    on CPU, generated kernels split work over threads only past aten's grain size (32768
    elements), as eager ops do: decoding runs on (B, 1, C) activations, and inductor's default
    (512 per thread) puts a fork/join around every small kernel, which cost 1.3-1.8x per step
    on this 2-core machine while it was busy. `options` (a dict) overrides these arguments.

    The decode step leaves out dynamo's guards on the model's modules (`STEP_GUARDS`, in
    `options`, unless a `mode` is given): each step's code object belongs to one model
    structure (`step_key.model_key`), which is what those guards checked at every token."""
    extra = {} if options is True else dict(options)  # type: ignore[arg-type]
    args: dict[str, Any] = {"fullgraph": True, "dynamic": not step}
    default_backend = extra.get("backend", "inductor") == "inductor"
    if default_backend and "mode" not in extra and "options" not in extra:
        if device.type == "cuda" and step:
            args["mode"] = "reduce-overhead"
        elif device.type == "cpu":
            args["options"] = {"cpp.min_chunk_size": ATEN_GRAIN_SIZE}
    args = {**args, **extra}
    if step and "mode" not in args and STEP_GUARDS is not None:  # (a mode or options: not both)
        args["options"] = {"guard_filter_fn": STEP_GUARDS, **args.get("options", {})}
    return args


@functools.cache
def _step_for(batch: int, length: int, model: tuple = ()) -> Callable:
    """`_decode` under a code object of its own for one (batch size, cache length, model
    structure: `step_key.model_key`). Dynamo keeps compiled code per code object and, under
    fullgraph, fails hard past its recompile limit (8): with every (batch, length) a static
    step of the one `_decode`, the ninth length a process generated at raised. One code object
    per shape keeps each to its few variants (dtypes, devices), and later calls of that shape
    reuse its code. One per model structure makes it safe to compile the step without guards
    on the model's modules (`STEP_GUARDS`): code compiled for one structure never runs on
    another. The model's id is part of `model` too: a step binds its caches to the model's
    attention modules (a guard on their ids), so models of one structure would otherwise pile
    their variants into one code object, up to that limit. (A cache of functions, as torch's
    own cache of compiled code: nothing in it changes a result.)"""
    code = _decode.__code__.replace(co_name=f"_decode_b{batch}_t{length}")
    step = types.FunctionType(code, _decode.__globals__, code.co_name, _decode.__defaults__)
    step.__doc__ = _decode.__doc__
    return step


def _compiled(
    options: bool | dict[str, Any], device: torch.device, model: nn.Module
) -> tuple[Callable, Callable[[int, int], Callable]]:
    """The prefill, and the decode step of a (batch, cache length), under torch.compile
    (see `_compile_args`); the model's structure is read here, once per call."""
    prefill = torch.compile(_prefill, **_compile_args(options, device, step=False))
    step_args = _compile_args(options, device, step=True)
    key = (id(model), model_key(model))  # (each model's steps apart: see `_step_for`)

    def decode_for(batch: int, length: int) -> Callable:
        args = dict(step_args)
        if "options" in args:  # (torch.compile pops the guard filter out of its options)
            args["options"] = dict(args["options"])
        return torch.compile(_step_for(batch, length, key), **args)

    return prefill, decode_for


def _check_mask(attention_mask: object, shape: torch.Size) -> Tensor:
    """A (B, P) padding mask, boolean or 1/0, as a boolean mask (values read once per call)."""
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != shape:
        got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else None
        raise ValueError(
            f"attention_mask must have the shape of prompt_ids {tuple(shape)}, got "
            f"{got if got is not None else type(attention_mask).__name__}"
        )
    return masks.from_hf_padding(attention_mask, always=True)


def generate_stream(
    model: CausalLM,
    prompt_ids: Tensor,
    max_new_tokens: int,
    *,
    attention_mask: Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos: int | None = None,
    generator: torch.Generator | None = None,
    compile: bool | dict[str, Any] = False,
    eos_check_every: int | None = None,
) -> Iterator[Tensor]:
    """Yield the next token of every row (B,), one step at a time.

    Prompts of different lengths: left-pad them and pass `attention_mask` (1 = token).
    temperature 0 = greedy; `top_k`, `top_p` filter sampling. Rows that produced `eos` keep
    producing `eos`; generation stops when all have. `eos_check_every`: steps between the host
    reads of "have all rows finished" (default 1 on CPU, where a read is free, 8 elsewhere);
    tokens are yielded after each read, so the output is the same for every value.
    `compile=True` compiles the prefill and the decode step (see the module docstring); a dict
    is passed on to `torch.compile` (e.g. `{"backend": "aot_eager"}`, `{"mode": ...}`).
    Inputs are checked here, once per call (token ids, mask, position-table room)."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        got = tuple(prompt_ids.shape) if isinstance(prompt_ids, Tensor) else type(prompt_ids)
        raise ValueError(f"prompt_ids must have shape (B, P) with P >= 1, got {got}")
    config = model.config
    check_token_ids("prompt_ids", prompt_ids, config.vocab_size, always=True)
    if eos is not None and (
        isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < config.vocab_size
    ):
        raise ValueError(f"eos must be a token id in [0, {config.vocab_size}) or None, got {eos!r}")
    if not isinstance(compile, (bool, dict)):
        raise TypeError(
            f"compile must be a bool or a dict of torch.compile options, got {compile!r}"
        )
    if eos_check_every is not None and (
        isinstance(eos_check_every, bool)
        or not isinstance(eos_check_every, int)
        or eos_check_every < 1
    ):
        raise ValueError(f"eos_check_every must be a positive int or None, got {eos_check_every!r}")
    P = prompt_ids.shape[1]
    mask = None if attention_mask is None else _check_mask(attention_mask, prompt_ids.shape)
    if mask is not None and bool(mask.all()):  # no padding: the unmasked (fused) path
        mask = None
    longest = P if mask is None else int(mask.sum(-1).max())
    if config.positions_bounded() and longest + max_new_tokens > config.max_positions:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) is longer "
            f"than the position table ({config.max_positions} positions)"
        )
    if compile is not False and observed(model):
        raise ValueError(
            "generate(compile=...) runs compiled steps, which carry no hooks: inside capture, "
            "hooks() or run_with_cache, generate with compile=False"
        )
    device = prompt_ids.device
    every = eos_check_every or (1 if device.type == "cpu" else 8)
    steps = _compiled(compile, device, model) if compile is not False else None  # type: ignore[arg-type]
    return _stream(
        model,
        prompt_ids,
        mask,
        max_new_tokens,
        (temperature, top_k, top_p, generator),
        eos,
        every,
        steps,
    )


@torch.inference_mode()
def _stream(
    model: CausalLM,
    prompt_ids: Tensor,
    mask: Tensor | None,
    new: int,
    sampling: tuple[float, int | None, float | None, torch.Generator | None],
    eos: int | None,
    every: int,
    steps: tuple[Callable, Callable[[int, int], Callable]] | None,
) -> Iterator[Tensor]:
    B, P = prompt_ids.shape
    device = prompt_ids.device
    length = P + new
    if steps is not None:  # calls of similar lengths share the compiled code's cache shape
        length = -(-length // STATIC_CACHE_BUCKET) * STATIC_CACHE_BUCKET
    caches = model.make_caches(B, max_length=length, static=steps is not None)
    head = head_copy_for(model, B, new)
    prefill, decode = (steps[0], steps[1](B, length)) if steps else (_prefill, _decode)
    graphs = steps is not None and device.type == "cuda"
    if mask is None:
        positions, prompt_positions = torch.full((B,), P, device=device), None
    else:  # real tokens before each one: left padding does not shift positions
        prompt_positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, P)
        positions = mask.sum(-1)  # (B,) the position of each row's first new token
    logits = prefill(model, prompt_ids, mask, prompt_positions, caches, head)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    held: list[Tensor] = []  # tokens not yet yielded (waiting for the eos read)
    all_done: list[Tensor] = []  # per held step: had every row finished? (on the device)
    for step in range(new):
        token = sample(logits, *sampling)
        last = step + 1 == new
        if eos is None:
            yield token
        else:
            token = torch.where(finished, torch.full_like(token, eos), token)
            finished |= token == eos
            held.append(token)
            all_done.append(finished.all())
            if last or len(held) == every:
                flags = torch.stack(all_done).tolist()  # the one host read per `every` steps
                stop = flags.index(True) + 1 if True in flags else len(held)
                yield from held[:stop]
                if stop < len(held) or flags[-1]:
                    return
                held, all_done = [], []
        if last:
            return
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        logits = decode(model, token[:, None], positions[:, None], caches, head)
        positions = positions + 1


def _check_options(kwargs: dict[str, Any]) -> None:
    """generate's keywords are generate_stream's: name a stranger as generate's (the generator
    would name itself, a function the caller never called)."""
    taken = list(inspect.signature(generate_stream).parameters)[3:]  # (after the positionals)
    unknown = [name for name in kwargs if name not in taken]
    if unknown:
        raise TypeError(
            f"generate() got an unexpected keyword argument {unknown[0]!r}; "
            f"it takes {', '.join(taken)}"
        )


def generate(model: CausalLM, prompt_ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
    """(B, P + new): the prompts followed by the generated tokens (see `generate_stream`)."""
    _check_options(kwargs)
    new = list(generate_stream(model, prompt_ids, max_new_tokens, **kwargs))
    return torch.cat([prompt_ids, torch.stack(new, dim=1)], dim=1)
