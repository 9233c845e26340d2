"""Combining per-task gradients when one step trains several tasks.

PCGrad (Yu et al. 2020, "Gradient Surgery for Multi-Task Learning") projects the gradients of the
shared parameters only: a task-specific head receives a gradient from its own task alone, and it
keeps that gradient as it is.
"""
from __future__ import annotations

import random

from torch import Tensor


def _dot(a: list[Tensor], b: list[Tensor]) -> Tensor:
    return sum((x.double() * y.double()).sum() for x, y in zip(a, b))


def pcgrad_combine(task_gradients: list[list[Tensor]], shared: list[bool], rng: random.Random) -> list[Tensor]:
    """Sum of the tasks' gradients after PCGrad's projection of the shared parameters.

    task_gradients[i][k] is task i's gradient of parameter k (zeros where the task does not reach it);
    shared[k] says whether parameter k serves every task. On the shared parameters, each task's gradient
    drops its component along every other task's gradient it conflicts with (negative dot product, over
    the shared parameters), the others taken in random order. Other parameters get the plain sum.
    """
    if any(len(gradient) != len(shared) for gradient in task_gradients):
        raise ValueError("every task needs one gradient per parameter")
    shared_index = [k for k, is_shared in enumerate(shared) if is_shared]
    shared_gradients = [[gradient[k] for k in shared_index] for gradient in task_gradients]
    projected = []
    for i, gradient in enumerate(shared_gradients):
        others = [j for j in range(len(shared_gradients)) if j != i]
        rng.shuffle(others)
        for j in others:
            other = shared_gradients[j]
            conflict = _dot(gradient, other)
            if conflict < 0:
                scale = (conflict / _dot(other, other).clamp_min(1e-30)).to(gradient[0].dtype)
                gradient = [g - scale * h for g, h in zip(gradient, other)]
        projected.append(gradient)
    combined = [sum(parts) for parts in zip(*task_gradients)]
    for position, k in enumerate(shared_index):
        combined[k] = sum(gradient[position] for gradient in projected)
    return combined
