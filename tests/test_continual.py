"""continual.py: EWC and L2-SP on a linear model y = w x + b whose Fisher and penalties are computed by hand."""
import math

import pytest
import torch
from torch import nn

from minbert.training.continual import L2SP, ElasticWeightConsolidation, diagonal_fisher, trainable_parameters

# Two batches of one example each, squared error: batch loss (w x + b - y)^2.
DATA = [(1.0, 0.0), (2.0, 0.0)]


def linear(w: float, b: float) -> nn.Linear:
    model = nn.Linear(1, 1)
    set_weights(model, w, b)
    return model


def set_weights(model: nn.Linear, w: float, b: float) -> None:
    with torch.no_grad():
        model.weight.fill_(w)
        model.bias.fill_(b)


def batch_losses(model: nn.Module, data=DATA):
    def losses():
        for x, y in data:
            yield (model(torch.tensor([[x]])) - y).pow(2).sum()
    return losses


def test_diagonal_fisher_by_hand():
    # At w = 0.5, b = 0: residuals r = 0.5 (x = 1) and 1.0 (x = 2); gradients (2 r x, 2 r) = (1, 1) and (4, 2).
    model = linear(0.5, 0.0)
    fisher = diagonal_fisher(model, batch_losses(model))
    assert fisher["weight"].item() == pytest.approx((1 ** 2 + 4 ** 2) / 2)  # 8.5
    assert fisher["bias"].item() == pytest.approx((1 ** 2 + 2 ** 2) / 2)  # 2.5


def test_one_batch_of_both_examples_squares_their_mean_gradient():
    model = linear(0.5, 0.0)

    def mean_loss():
        x, y = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [0.0]])
        yield (model(x) - y).pow(2).mean()

    fisher = diagonal_fisher(model, mean_loss)
    assert fisher["weight"].item() == pytest.approx(((1 + 4) / 2) ** 2)
    assert fisher["bias"].item() == pytest.approx(((1 + 2) / 2) ** 2)


def test_diagonal_fisher_runs_without_dropout_touches_no_grad_and_restores_the_mode():
    model = linear(0.5, 0.0)
    modes = []

    def losses():
        for loss in batch_losses(model)():
            modes.append(model.training)
            yield loss

    model.train()
    diagonal_fisher(model, losses)
    assert modes == [False, False] and model.training
    assert model.weight.grad is None and model.bias.grad is None


def test_a_parameter_no_loss_reaches_gets_zero_fisher():
    model = nn.ModuleDict({"used": linear(0.5, 0.0), "unused": nn.Linear(1, 1)})
    fisher = diagonal_fisher(model, batch_losses(model["used"]))
    assert fisher["used.weight"].item() == pytest.approx(8.5)
    assert torch.count_nonzero(fisher["unused.weight"]) == 0 and torch.count_nonzero(fisher["unused.bias"]) == 0


def test_diagonal_fisher_refuses_no_batches_and_a_non_finite_loss():
    model = linear(0.5, 0.0)
    with pytest.raises(ValueError, match="no loss"):
        diagonal_fisher(model, lambda: iter(()))
    with pytest.raises(ValueError, match="batch 2 is not finite"):
        diagonal_fisher(model, batch_losses(model, [(1.0, 0.0), (1.0, math.nan)]))


def test_ewc_penalty_and_its_gradient_by_hand():
    model = linear(0.5, 0.0)
    ewc = ElasticWeightConsolidation(model, weight=2.0)
    assert ewc.penalty(model).item() == 0.0  # nothing consolidated yet
    ewc.consolidate(model, batch_losses(model))  # F = (8.5, 2.5) at theta* = (0.5, 0)
    assert ewc.penalty(model).item() == 0.0
    set_weights(model, 1.5, -1.0)
    penalty = ewc.penalty(model)
    assert penalty.item() == pytest.approx(2.0 / 2 * (8.5 * 1.0 ** 2 + 2.5 * (-1.0) ** 2))  # 11
    penalty.backward()
    # d/dtheta_i = lambda F_i (theta_i - theta*_i)
    assert model.weight.grad.item() == pytest.approx(2.0 * 8.5 * 1.0)
    assert model.bias.grad.item() == pytest.approx(2.0 * 2.5 * -1.0)


def test_ewc_on_named_parameters_only():
    model = linear(0.5, 0.0)
    ewc = ElasticWeightConsolidation(model, weight=2.0, names=["weight"])
    ewc.consolidate(model, batch_losses(model))
    set_weights(model, 1.5, -1.0)
    assert ewc.penalty(model).item() == pytest.approx(8.5)  # the bias moved freely


def test_a_second_consolidation_adds_its_fisher_and_moves_the_anchor():
    model = linear(0.5, 0.0)
    ewc = ElasticWeightConsolidation(model, weight=2.0)
    ewc.consolidate(model, batch_losses(model))
    set_weights(model, 1.5, -1.0)
    # Residuals 0.5 and 2.0: gradients (1, 1) and (8, 4), so F = ((1 + 64) / 2, (1 + 16) / 2) = (32.5, 8.5).
    ewc.consolidate(model, batch_losses(model))
    assert ewc.fisher["weight"].item() == pytest.approx(8.5 + 32.5)
    assert ewc.fisher["bias"].item() == pytest.approx(2.5 + 8.5)
    assert ewc.penalty(model).item() == 0.0  # anchored at (1.5, -1)
    set_weights(model, 2.5, -1.0)
    assert ewc.penalty(model).item() == pytest.approx(2.0 / 2 * 41.0 * 1.0 ** 2)


def test_ewc_state_round_trip_gives_the_same_penalty():
    model = linear(0.5, 0.0)
    ewc = ElasticWeightConsolidation(model, weight=2.0)
    assert ewc.state_dict() == {}
    ewc.consolidate(model, batch_losses(model))
    set_weights(model, 1.5, -1.0)
    resumed = ElasticWeightConsolidation(model, weight=2.0)
    resumed.load_state_dict(ewc.state_dict())
    assert sorted(ewc.state_dict()) == ["anchor.bias", "anchor.weight", "fisher.bias", "fisher.weight"]
    assert resumed.penalty(model).item() == pytest.approx(11.0)
    resumed.load_state_dict({})
    assert resumed.penalty(model).item() == 0.0
    with pytest.raises(ValueError, match="missing"):
        resumed.load_state_dict({"fisher.weight": torch.ones(1, 1)})
    wrong_shape = {**ewc.state_dict(), "fisher.weight": torch.ones(3)}
    with pytest.raises(ValueError, match="shapes differ"):
        resumed.load_state_dict(wrong_shape)


def test_l2sp_penalty_and_its_gradient_by_hand():
    model = linear(0.5, 0.0)  # the "pretrained" weights
    l2sp = L2SP(model, weight=0.1)
    assert l2sp.penalty(model).item() == 0.0
    set_weights(model, 1.5, -1.0)
    penalty = l2sp.penalty(model)
    assert penalty.item() == pytest.approx(0.1 / 2 * (1.0 ** 2 + (-1.0) ** 2))
    penalty.backward()
    # d/dtheta = alpha (theta - theta_start)
    assert (model.weight.grad.item(), model.bias.grad.item()) == pytest.approx((0.1, -0.1))
    assert L2SP(linear(0.5, 0.0), weight=0.1, names=["bias"]).penalty(model).item() == pytest.approx(0.05)


def test_the_regularisers_refuse_bad_weights_and_names():
    model = linear(0.5, 0.0)
    for weight in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="weight"):
            ElasticWeightConsolidation(model, weight)
        with pytest.raises(ValueError, match="weight"):
            L2SP(model, weight)
    with pytest.raises(ValueError, match="not trainable"):
        trainable_parameters(model, ["nope"])
    model.bias.requires_grad_(False)  # a frozen weight cannot be held anywhere: naming it is a mistake
    with pytest.raises(ValueError, match="'bias'"):
        L2SP(model, 0.1, names=["weight", "bias"])
    assert list(trainable_parameters(model)) == ["weight"]
    model.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        trainable_parameters(model)
