"""gradient_surgery.py: PCGrad on the shared parameters, by hand; heads keep their own task's gradient."""
import random

import pytest
import torch

from gradient_surgery import pcgrad_combine


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
