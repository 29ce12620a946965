"""A backward pass with no second derivative that says so on every path.

torch's `once_differentiable` marks a backward's results with an error node only when a
gradient flowing in requires grad, and that node links to nothing: `autograd.grad` of a
first gradient with respect to a weight (a gradient penalty, say) skips it and returns the
linear layers' terms alone, a silently incomplete second derivative. `first_order` instead,
when the backward runs under `create_graph=True`, adds to each result a zero that depends on
the Function's saved inputs (and on incoming gradients that require grad) and whose own
backward raises: any second derivative through the Function, by `.backward()` or by
`autograd.grad` towards any leaf, is then a clear error. Without `create_graph` the backward
runs as before, under no_grad, and nothing is added.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor


class _NoSecondDerivative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, name: str) -> Tensor:
        ctx.name = name
        return x.new_zeros(())

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(
            f"{ctx.name} has no second derivative (a gradient of a gradient through it, as "
            "create_graph=True asks for; torch's fused attention kernels have none either): "
            "attention(..., backend='eager') is plain torch and twice differentiable"
        )


def first_order(name: str) -> Callable:
    """Decorate an autograd.Function's backward(ctx, *grads) (see the module docstring);
    `name` says what has no second derivative in the error."""

    def decorate(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            with torch.no_grad():
                results = backward(ctx, *grads)
            if not torch.is_grad_enabled():  # (no create_graph: the common backward)
                return results
            sources = [t for t in (*ctx.saved_tensors, *grads) if _tracked(t)]
            if not sources:
                return results
            zero = sum(_NoSecondDerivative.apply(t, name) for t in sources)
            return tuple(_plus(r, zero) for r in results)

        return wrapper

    return decorate


def _tracked(t: object) -> bool:
    return isinstance(t, Tensor) and t.requires_grad


def _plus(result: object, zero: Tensor) -> object:
    if isinstance(result, Tensor) and result.is_floating_point():
        return result + zero
    return result
