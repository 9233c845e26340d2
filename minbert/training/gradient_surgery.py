"""Combining per-task gradients when one step trains several tasks.

    none    the plain sum
    pcgrad  PCGrad (Yu et al. 2020, "Gradient Surgery for Multi-Task Learning")
    cagrad  CAGrad (Liu et al. 2021, "Conflict-Averse Gradient Descent for Multi-task Learning")

Both surgeries act on the gradients of the shared parameters only: a task-specific head receives a
gradient from its own task alone, and it keeps that gradient as it is.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

SURGERIES = ("pcgrad", "cagrad")
GRADIENT_SURGERIES = ("none", *SURGERIES)  # --gradient_surgery: none sums the tasks' gradients, as one backward


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


def _simplex_projection(v: np.ndarray) -> np.ndarray:
    """The point of the probability simplex closest to v (Duchi et al. 2008)."""
    descending = np.sort(v)[::-1]
    cumulative = np.cumsum(descending) - 1
    rho = np.nonzero(descending * np.arange(1, len(v) + 1) > cumulative)[0][-1]
    return np.maximum(v - cumulative[rho] / (rho + 1), 0.0)


def cagrad_weights(gram: np.ndarray, c: float, iterations: int = 1000) -> np.ndarray:
    """w on the simplex minimising F(w) = g_w . g_0 + c ||g_0|| ||g_w||, CAGrad's dual problem, where
    g_w = sum_i w_i g_i and g_0 the mean gradient, written with the Gram matrix gram[i, j] = g_i . g_j.

    F is convex; it is minimised by projected gradient descent with backtracking. The minimiser does not
    change when the Gram matrix is scaled, so it is first normalised to a unit mean diagonal.
    """
    k = len(gram)
    gram = np.asarray(gram, dtype=np.float64)
    gram = gram / max(np.trace(gram) / k, 1e-300)
    towards_mean = gram.mean(axis=1)  # gram @ (1/k): the gradient of g_w . g_0
    radius = c * math.sqrt(max(gram.mean(), 0.0))  # c ||g_0||

    def objective(w):
        return w @ towards_mean + radius * math.sqrt(max(w @ gram @ w, 0.0) + 1e-12)

    def gradient(w):
        return towards_mean + radius * (gram @ w) / math.sqrt(max(w @ gram @ w, 0.0) + 1e-12)

    w, step = np.full(k, 1.0 / k), 1.0
    for _ in range(iterations):
        g, value = gradient(w), objective(w)
        while True:
            candidate = _simplex_projection(w - step * g)
            move = candidate - w
            if objective(candidate) <= value + g @ move + move @ move / (2 * step) or step < 1e-12:
                break
            step /= 2
        if move @ move < 1e-20:
            break
        w, step = candidate, step * 2
    return w


def cagrad_combine(task_gradients: list[list[Tensor]], shared: list[bool], c: float = 0.4) -> list[Tensor]:
    """K * d / (1 + c^2) on the shared parameters, with CAGrad's update d = g_0 + c ||g_0|| g_w / ||g_w||
    for the w of `cagrad_weights` (the authors' code rescales by 1 / (1 + c^2)); other parameters get the
    plain sum. The factor K (tasks) puts d on the scale of the summed gradient, so c = 0 is the plain sum.

    d maximises the worst task's improvement in a ball of radius c ||g_0|| around the average gradient.
    """
    if any(len(gradient) != len(shared) for gradient in task_gradients):
        raise ValueError("every task needs one gradient per parameter")
    if c < 0:
        raise ValueError(f"CAGrad's c must be >= 0, got {c}")
    k = len(task_gradients)
    shared_index = [i for i, is_shared in enumerate(shared) if is_shared]
    shared_gradients = [[gradient[i] for i in shared_index] for gradient in task_gradients]
    gram = np.array([[float(_dot(a, b)) for b in shared_gradients] for a in shared_gradients])
    w = cagrad_weights(gram, c)
    mean_norm = math.sqrt(max(gram.mean(), 0.0))  # ||g_0||
    weighted_norm = math.sqrt(max(w @ gram @ w, 0.0))  # ||g_w||
    scale = c * mean_norm / weighted_norm if weighted_norm > 0 else 0.0
    coefficients = [(1 / k + scale * w_i) * k / (1 + c * c) for w_i in w]  # d's weight on each g_i, times K
    combined = [sum(parts) for parts in zip(*task_gradients)]
    for position, i in enumerate(shared_index):
        combined[i] = sum(coefficient * gradient[position]
                          for coefficient, gradient in zip(coefficients, shared_gradients))
    return combined


@dataclass(frozen=True)
class GradientSurgery:
    """How a multi-task step combines its tasks' gradients: `method` (one of SURGERIES), with CAGrad's radius c."""
    method: str
    cagrad_c: float = 0.4  # the CAGrad authors' default

    def __post_init__(self):
        if self.method not in SURGERIES:
            raise ValueError(f"gradient surgery must be one of {SURGERIES}, got {self.method!r}")

    def combine(self, task_gradients: list[list[Tensor]], shared: list[bool], rng: random.Random) -> list[Tensor]:
        """One gradient per parameter from the tasks' gradients (task_gradients[t][p])."""
        if self.method == "pcgrad":
            return pcgrad_combine(task_gradients, shared, rng)
        return cagrad_combine(task_gradients, shared, self.cagrad_c)


class SeparateTaskGradients:
    """Gradient surgery's step: the gradients of each task's batches kept apart (averaged over ranks: the surgery
    sees global gradients), then combined by `surgery` into .grad, added to what the accumulation group had before.
    A task's batches come together: `start(task)` before each batch begins the task's gradient when it is new."""

    def __init__(self, model, surgery: GradientSurgery, distributed):
        self.named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.model, self.surgery, self.distributed = model, surgery, distributed
        self.accumulated = [p.grad for _, p in self.named]
        self.task, self.task_gradients = None, []

    def start(self, task: str) -> None:
        if task == self.task:
            return
        self.keep_task_gradient()
        self.task = task
        for _, p in self.named:
            p.grad = None

    def keep_task_gradient(self) -> None:
        if self.task is not None:
            gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in self.named]
            self.task_gradients.append(self.distributed.average_tensors(gradients))

    def combine(self, rng: random.Random) -> None:
        self.keep_task_gradient()
        combined = self.surgery.combine(self.task_gradients, [self.model.is_shared(name) for name, _ in self.named],
                                        rng)
        for (_, p), previous, gradient in zip(self.named, self.accumulated, combined):
            p.grad = gradient if previous is None else previous + gradient
