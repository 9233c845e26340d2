"""gradient_surgery.py: PCGrad on the shared parameters, by hand; heads keep their own task's gradient."""
import math
import random

import numpy as np
import pytest
import torch

from minbert.training.gradient_surgery import GradientSurgery, cagrad_combine, cagrad_weights, pcgrad_combine


def test_pcgrad_projects_conflicting_gradients_by_hand():
    g1 = [torch.tensor([1.0, 0.0])]
    g2 = [torch.tensor([-1.0, 1.0])]
    combined = pcgrad_combine([g1, g2], [True], random.Random(0))
    # g1 . g2 = -1 < 0: g1' = g1 - (-1/2) g2 = (0.5, 0.5); g2' = g2 - (-1/1) g1 = (0, 1); sum = (0.5, 1.5)
    torch.testing.assert_close(combined[0], torch.tensor([0.5, 1.5]))


def test_pcgrad_leaves_agreeing_gradients_alone():
    g1, g2 = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])], [torch.tensor([2.0, 0.0]), torch.tensor([1.0])]
    combined = pcgrad_combine([g1, g2], [True, True], random.Random(0))
    torch.testing.assert_close(combined[0], torch.tensor([3.0, 2.0]))
    torch.testing.assert_close(combined[1], torch.tensor([4.0]))


def test_pcgrad_result_never_conflicts_with_a_task_for_two_tasks():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        g1, g2 = [torch.randn(5, generator=generator)], [torch.randn(5, generator=generator)]
        combined = pcgrad_combine([g1, g2], [True], random.Random(0))[0]
        assert (combined @ g1[0]).item() >= -1e-6 and (combined @ g2[0]).item() >= -1e-6


def test_heads_keep_their_own_task_gradient_and_only_the_shared_part_is_projected():
    # Parameters: one shared vector, then task 1's head and task 2's head (each reached by its task alone).
    shared, head_1, head_2 = torch.tensor([1.0, 0.0]), torch.tensor([2.0]), torch.tensor([3.0])
    g1 = [shared, head_1, torch.zeros(1)]
    g2 = [torch.tensor([-1.0, 1.0]), torch.zeros(1), head_2]
    combined = pcgrad_combine([g1, g2], [True, False, False], random.Random(0))
    # The projection reads the shared parameters only (dot -1, squared norms 1 and 2), as in the
    # two-parameter case by hand above; the heads' gradients pass through exactly.
    torch.testing.assert_close(combined[0], torch.tensor([0.5, 1.5]))
    assert torch.equal(combined[1], head_1) and torch.equal(combined[2], head_2)
    # Projecting every parameter (the head gradients inside the vectors) would change both.
    everything = pcgrad_combine([g1, g2], [True, True, True], random.Random(0))
    assert not torch.equal(everything[2], head_2)
    assert not torch.allclose(everything[0], torch.tensor([0.5, 1.5]))


def test_every_head_of_three_tasks_gets_exactly_its_own_gradient():
    generator = torch.Generator().manual_seed(1)
    heads = [torch.randn(4, 3, generator=generator) for _ in range(3)]
    task_gradients = []
    for task in range(3):
        own = [heads[task] if h == task else torch.zeros(4, 3) for h in range(3)]
        task_gradients.append([torch.randn(6, generator=generator), torch.randn(2, 2, generator=generator), *own])
    # Make sure some pair conflicts on the shared parameters, so the projection is not a no-op.
    task_gradients[1][0], task_gradients[1][1] = -task_gradients[0][0], -task_gradients[0][1] + 0.1
    combined = pcgrad_combine(task_gradients, [True, True, False, False, False], random.Random(0))
    for task in range(3):
        assert torch.equal(combined[2 + task], heads[task])
    plain_sum = sum(g[0] for g in task_gradients)
    assert not torch.allclose(combined[0], plain_sum)


def test_every_task_needs_one_gradient_per_parameter():
    with pytest.raises(ValueError, match="one gradient per parameter"):
        pcgrad_combine([[torch.zeros(2)], [torch.zeros(2), torch.zeros(1)]], [True], random.Random(0))


# --- CAGrad ---------------------------------------------------------------------------------------

def dual_objective(w, gram, c):
    k = len(gram)
    return w @ gram @ np.full(k, 1 / k) + c * math.sqrt(gram.mean()) * math.sqrt(w @ gram @ w)


def test_cagrad_weights_minimise_the_dual_against_a_direct_search_over_the_simplex():
    rng = np.random.default_rng(0)
    grid = [np.array([a, b, 1 - a - b]) for a in np.linspace(0, 1, 201) for b in np.linspace(0, 1, 201) if a + b <= 1]
    for _ in range(5):
        g = rng.normal(size=(3, 8))
        g[1] -= 1.5 * g[0]  # a conflict
        gram = g @ g.T
        w = cagrad_weights(gram, 0.4)
        assert w.min() >= 0 and w.sum() == pytest.approx(1)
        best = min(dual_objective(x, gram, 0.4) for x in grid)
        assert dual_objective(w, gram, 0.4) <= best + 1e-9


def test_cagrad_on_two_tasks_by_hand():
    # Orthogonal unit gradients: by symmetry w = (1/2, 1/2), g_w = g_0 = (1/2, 1/2), ||g_0|| = 1/sqrt(2),
    # so d = g_0 + c ||g_0|| g_w / ||g_w|| = (1 + c) g_0, returned as K d / (1 + c^2).
    c = 0.4
    combined = cagrad_combine([[torch.tensor([1.0, 0.0])], [torch.tensor([0.0, 1.0])]], [True], c)[0]
    torch.testing.assert_close(combined, torch.tensor([1.0, 1.0]) * (1 + c) / (1 + c * c))


def test_cagrad_update_never_hurts_a_task_more_than_the_mean_would_and_c_zero_is_the_sum():
    rng = np.random.default_rng(1)
    g = rng.normal(size=(3, 6))
    g[2] = -0.8 * g[0] + 0.2 * rng.normal(size=6)
    grads = [[torch.tensor(row, dtype=torch.float64)] for row in g]
    plain = sum(torch.tensor(row) for row in g)
    torch.testing.assert_close(cagrad_combine(grads, [True], 0.0)[0], plain)
    c = 0.5
    d = cagrad_combine(grads, [True], c)[0].numpy() * (1 + c * c) / 3  # undo the K / (1 + c^2) scaling
    mean = plain.numpy() / 3
    assert np.linalg.norm(d - mean) == pytest.approx(c * np.linalg.norm(mean))  # on the ball around g_0
    # CAGrad maximises the worst task's first-order improvement min_i g_i . d over that ball, where
    # the mean itself lies: the worst task does strictly better than under the mean here.
    assert min(g @ d) > min(g @ mean) + 1e-6


def test_cagrad_leaves_the_heads_their_plain_sum():
    g1 = [torch.tensor([1.0, 0.0]), torch.tensor([2.0]), torch.tensor([0.0])]
    g2 = [torch.tensor([-1.0, 0.5]), torch.tensor([0.0]), torch.tensor([3.0])]
    combined = cagrad_combine([g1, g2], [True, False, False], 0.4)
    assert torch.equal(combined[1], torch.tensor([2.0])) and torch.equal(combined[2], torch.tensor([3.0]))


def test_gradient_surgery_dispatches_and_rejects_an_unknown_method():
    g1, g2 = [torch.tensor([1.0, 0.0])], [torch.tensor([-1.0, 1.0])]
    assert torch.equal(GradientSurgery("pcgrad").combine([g1, g2], [True], random.Random(0))[0],
                       pcgrad_combine([g1, g2], [True], random.Random(0))[0])
    assert torch.equal(GradientSurgery("cagrad", 0.2).combine([g1, g2], [True], random.Random(0))[0],
                       cagrad_combine([g1, g2], [True], 0.2)[0])
    for method in ("mgda", "none"):  # none is no surgery: the trainer gets no GradientSurgery at all
        with pytest.raises(ValueError, match="gradient surgery must be one of"):
            GradientSurgery(method)