import math
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from conftest import deterministic_tiny_model, sentence_batch, tiny_model
import smart
from smart import (DIVERGENCES, BregmanAnchor, SmartConfig, SmartRegularizer, adversarial_regularizer, ascend,
                   bregman_momentum, find_perturbation, reduced_divergence, squared_error, symmetric_kl_bernoulli,
                   symmetric_kl_categorical)

HIDDEN = 6
VOCAB = 11
TASK_DIVERGENCE = {"sentiment": "categorical", "paraphrase": "bernoulli", "similarity": "squared"}


class TinyMultitask(nn.Module):
    """Embedding -> per-token MLP -> dropout -> masked mean pool -> task head, split like MultitaskBERT
    into embed / outputs_from_embeddings so SMART can perturb the embedding output; as there, both
    sentences of a pair are one (2B, T, H) batch."""

    def __init__(self, dropout: float = 0.1):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.encoder = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN))
        self.dropout = nn.Dropout(dropout)
        self.sentiment = nn.Linear(HIDDEN, 3)
        self.paraphrase = nn.Linear(3 * HIDDEN, 1)
        # A buffer the anchor must read from the live model.
        self.register_buffer("similarity_scale", torch.tensor(2.5))

    def embed(self, task, batch):
        return self.embedding(token_ids(task, batch))  # (B, T, H) or (2B, T, H)

    def _pool(self, embeddings, ids):
        hidden = self.dropout(embeddings + self.encoder(embeddings))  # (B, T, H)
        mask = (ids != 0).unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        return (hidden * mask).sum(1) / mask.sum(1)  # (B, H)

    def outputs_from_embeddings(self, task, embeddings, batch):
        pooled = self._pool(embeddings, token_ids(task, batch))
        if task == "sentiment":
            return self.sentiment(pooled)  # (B, 3)
        u, v = pooled.chunk(2)  # (B, H) each
        if task == "paraphrase":
            return self.paraphrase(torch.cat([u, v, (u - v).abs()], dim=-1)).squeeze(-1)  # (B,)
        return F.cosine_similarity(u, v, dim=-1) * self.similarity_scale + self.similarity_scale  # (B,)

    def forward(self, task, batch):
        return self.outputs_from_embeddings(task, self.embed(task, batch), batch)


def token_ids(task, batch):
    """The (B, T) sentences, or both sides of the (B, T) pairs stacked as (2B, T)."""
    return batch["ids"] if task == "sentiment" else torch.cat([batch["ids_1"], batch["ids_2"]])


def make_batch(task, batch_size=4, length=5, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def ids():
        tokens = torch.randint(1, VOCAB, (batch_size, length), generator=generator)
        tokens[0, -2:] = 0  # some padding
        return tokens

    if task == "sentiment":
        return {"ids": ids(), "labels": torch.randint(0, 3, (batch_size,), generator=generator)}
    batch = {"ids_1": ids(), "ids_2": ids()}
    if task == "paraphrase":
        batch["labels"] = torch.randint(0, 2, (batch_size,), generator=generator).double()
    else:
        batch["labels"] = torch.rand(batch_size, generator=generator, dtype=torch.float64) * 5
    return batch


def task_loss(task, outputs, labels):
    if task == "sentiment":
        return F.cross_entropy(outputs, labels)
    if task == "paraphrase":
        return F.binary_cross_entropy_with_logits(outputs, labels)
    return F.mse_loss(outputs, labels)


def make_model(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return TinyMultitask(dropout).double()


def forward_fn_for(model, task, batch):
    return lambda embeddings: model.outputs_from_embeddings(task, embeddings, batch)


# --- divergences -------------------------------------------------------------------------------------


def softmax_np(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_symmetric_kl_categorical_matches_hand_computation():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 4)) * 3, rng.normal(size=(5, 4)) * 3
    p, q = softmax_np(a), softmax_np(b)
    expected = np.mean([sum(p[i] * np.log(p[i] / q[i]) + q[i] * np.log(q[i] / p[i])) for i in range(5)])
    got = symmetric_kl_categorical(torch.tensor(a), torch.tensor(b))
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_symmetric_kl_bernoulli_matches_hand_computation():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=7) * 4, rng.normal(size=7) * 4
    p, q = 1 / (1 + np.exp(-a)), 1 / (1 + np.exp(-b))
    kl_pq = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
    kl_qp = q * np.log(q / p) + (1 - q) * np.log((1 - q) / (1 - p))
    got = symmetric_kl_bernoulli(torch.tensor(a), torch.tensor(b))
    assert got.item() == pytest.approx(np.mean(kl_pq + kl_qp), rel=1e-10)


def test_squared_error_matches_hand_computation():
    a, b = np.array([0.5, 2.0, -1.0]), np.array([1.5, 2.0, 1.0])
    assert squared_error(torch.tensor(a), torch.tensor(b)).item() == pytest.approx((1 + 0 + 4) / 3)


def test_divergences_are_sums_over_non_batch_dimensions():
    a, b = torch.randn(4, 1, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    assert symmetric_kl_bernoulli(a, b) == symmetric_kl_bernoulli(a.squeeze(1), b.squeeze(1))
    assert squared_error(a, b) == squared_error(a.squeeze(1), b.squeeze(1))


SHAPES = {"categorical": (6, 3), "bernoulli": (6,), "squared": (6,), "span": (6, 5, 2)}  # what each task outputs


def test_span_divergence_is_the_mean_of_the_start_and_end_divergences():
    a, b = torch.randn(4, 7, 2, dtype=torch.float64), torch.randn(4, 7, 2, dtype=torch.float64)
    start = symmetric_kl_categorical(a[..., 0], b[..., 0])
    end = symmetric_kl_categorical(a[..., 1], b[..., 1])
    assert DIVERGENCES["span"](a, b).item() == pytest.approx(((start + end) / 2).item(), rel=1e-12)


def test_span_divergence_ignores_masked_padding():
    a, b = torch.randn(2, 5, 2), torch.randn(2, 5, 2)
    padded_a, padded_b = (torch.cat([x, torch.full((2, 3, 2), -1e4)], dim=1) for x in (a, b))  # 3 padding tokens
    assert DIVERGENCES["span"](padded_a, padded_b).item() == pytest.approx(DIVERGENCES["span"](a, b).item(), rel=1e-6)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_divergence_is_symmetric_and_zero_only_at_equality(name):
    divergence = DIVERGENCES[name]
    shape = SHAPES[name]
    a, b = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
    assert divergence(a, b).item() == pytest.approx(divergence(b, a).item(), rel=1e-12)
    assert divergence(a, a).item() == 0.0
    assert divergence(a, b).item() > 0.0


def test_categorical_divergence_ignores_a_logit_shift():
    # Logits that differ by a constant are the same distribution.
    a = torch.randn(3, 4, dtype=torch.float64)
    assert symmetric_kl_categorical(a, a + 7.0).item() == pytest.approx(0.0, abs=1e-12)


def test_divergences_stay_finite_for_saturated_logits():
    a = torch.tensor([[200.0, -200.0, 0.0]])
    b = torch.tensor([[-200.0, 200.0, 0.0]])
    assert symmetric_kl_categorical(a, b).item() == pytest.approx(2 * 400.0)
    assert symmetric_kl_bernoulli(a[:, 0], b[:, 0]).item() == pytest.approx(400.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_half_precision_inputs_are_computed_in_float32(name, dtype):
    divergence = DIVERGENCES[name]
    a, b = torch.randn(SHAPES[name]).to(dtype), torch.randn(SHAPES[name]).to(dtype)
    got = divergence(a, b)
    assert got.dtype == torch.float32
    assert torch.equal(got, divergence(a.float(), b.float()))


def test_divergence_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same shape"):
        squared_error(torch.zeros(4), torch.zeros(4, 1))


# --- config ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"adv_weight": -1.0},
        {"bregman_weight": math.nan},
        {"anchor_momentum": 1.0},
        {"anchor_momentum": -0.1},
        {"noise_std": 0.0},
        {"epsilon": -1e-5},
        {"epsilon": math.nan},
        {"step_size": math.inf},
        {"ascent_steps": 0},
        {"ascent_steps": 1.5},
        {"norm": "l1"},
        {"norm_level": "word"},
    ],
)
def test_config_rejects_bad_values(overrides):
    with pytest.raises(ValueError, match="SmartConfig"):
        SmartConfig(**overrides)


def test_unknown_divergence_is_rejected():
    model = make_model()
    batch = make_batch("sentiment")
    embeddings = model.embed("sentiment", batch)
    outputs = model("sentiment", batch)
    with pytest.raises(ValueError, match="unknown divergence"):
        find_perturbation(forward_fn_for(model, "sentiment", batch), embeddings, outputs, "kl", SmartConfig())


# --- perturbation --------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["inf", "l2"])
@pytest.mark.parametrize("norm_level", ["token", "sentence"])
def test_perturbation_stays_inside_the_epsilon_ball(norm, norm_level):
    model = make_model()
    batch = make_batch("paraphrase")
    embeddings = model.embed("paraphrase", batch)
    outputs = model("paraphrase", batch)
    epsilon = 1e-3
    config = SmartConfig(
        epsilon=epsilon, noise_std=1e-3, step_size=0.1, ascent_steps=3, norm=norm, norm_level=norm_level
    )
    delta = find_perturbation(forward_fn_for(model, "paraphrase", batch), embeddings, outputs, "bernoulli", config)
    assert delta.shape == embeddings.shape and not delta.requires_grad
    if norm == "inf":
        # The inf-ball is the same set at both levels: every entry within [-eps, eps].
        sizes = delta.abs().flatten(1).amax(dim=1)  # (2B,)
    elif norm_level == "token":
        # Padding tokens get no gradient and keep their random start, so only real tokens must hit the boundary.
        sizes = delta.norm(dim=-1)[token_ids("paraphrase", batch) != 0]  # (real tokens,)
        assert (delta.norm(dim=-1) <= epsilon * (1 + 1e-9)).all()
    else:
        sizes = delta.flatten(1).norm(dim=1)  # (2B,)
    assert (sizes <= epsilon * (1 + 1e-9)).all()
    # The step is 100 eps long, so the projection must have pulled every slice back to the boundary.
    torch.testing.assert_close(sizes, torch.full_like(sizes, epsilon), rtol=1e-9, atol=0)


class LinearScore(nn.Module):
    """f(x) = w . sum_t x_t, whose worst case over each ball is known in closed form."""

    def __init__(self, weight):
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, embeddings):
        return embeddings.sum(dim=1) @ self.weight  # (B,)


@pytest.mark.parametrize("norm", ["inf", "l2"])
@pytest.mark.parametrize("norm_level", ["token", "sentence"])
def test_one_ascent_step_reaches_the_worst_case_of_a_linear_model(norm, norm_level):
    torch.manual_seed(0)
    length, epsilon = 4, 1e-4
    # Entries of equal size but mixed sign, so one inf-normalised step saturates every coordinate.
    weight = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    model = LinearScore(weight)
    embeddings = torch.randn(3, length, HIDDEN, dtype=torch.float64)
    outputs = model(embeddings)
    config = SmartConfig(epsilon=epsilon, noise_std=1e-9, step_size=1.0, norm=norm, norm_level=norm_level)
    delta = find_perturbation(model, embeddings, outputs, "squared", config)
    worst_case = {
        ("inf", "token"): (length * epsilon * weight.abs().sum()) ** 2,
        ("inf", "sentence"): (length * epsilon * weight.abs().sum()) ** 2,
        ("l2", "token"): (length * epsilon * weight.norm()) ** 2,
        ("l2", "sentence"): length * epsilon**2 * weight.norm() ** 2,
    }[norm, norm_level]
    reached = squared_error(model(embeddings + delta), outputs)
    assert reached.item() == pytest.approx(worst_case.item(), rel=1e-6)


def ascent_setup(task):
    model = make_model()
    model.eval()  # no dropout noise, so only the perturbation changes the outputs
    batch = make_batch(task)
    embeddings = model.embed(task, batch)
    outputs = model(task, batch)
    forward_fn = forward_fn_for(model, task, batch)
    divergence = DIVERGENCES[TASK_DIVERGENCE[task]]

    def value(delta):
        return divergence(forward_fn(embeddings + delta), outputs).item()

    return forward_fn, embeddings, outputs, value


@pytest.mark.parametrize("task", sorted(TASK_DIVERGENCE))
def test_each_ascent_step_increases_the_divergence(task):
    forward_fn, embeddings, outputs, value = ascent_setup(task)
    # A ball too large to bind and steps short against the start, so each step is a plain gradient step.
    values = []
    for steps in (1, 2, 3):
        config = SmartConfig(epsilon=1.0, noise_std=1e-3, step_size=1e-4, ascent_steps=steps)
        torch.manual_seed(1)  # the same random start every time
        start = torch.randn_like(embeddings) * config.noise_std
        torch.manual_seed(1)
        values.append(value(find_perturbation(forward_fn, embeddings, outputs, TASK_DIVERGENCE[task], config)))
    assert value(start) < values[0] < values[1] < values[2]


@pytest.mark.parametrize("task", sorted(TASK_DIVERGENCE))
def test_ascent_beats_random_corners_of_the_ball(task):
    forward_fn, embeddings, outputs, value = ascent_setup(task)
    epsilon = 1e-3
    config = SmartConfig(epsilon=epsilon, noise_std=1e-4, step_size=1e-2, ascent_steps=2)
    found = find_perturbation(forward_fn, embeddings, outputs, TASK_DIVERGENCE[task], config)
    random_corners = [torch.randint_like(embeddings, 2) * 2 * epsilon - epsilon for _ in range(20)]
    assert value(found) > max(value(corner) for corner in random_corners)


def test_ascent_direction_does_not_depend_on_the_gradient_scale():
    # Near the random start the gradient is tiny; normalisation must still give a full-length step.
    torch.manual_seed(0)
    weight = torch.randn(HIDDEN, dtype=torch.float64)
    embeddings = torch.randn(2, 3, HIDDEN, dtype=torch.float64)
    config = SmartConfig(norm="l2", norm_level="sentence", epsilon=1e-3, noise_std=1e-9, step_size=1.0)
    found = {}
    for scale in (1.0, 1e-6):
        model = LinearScore(weight * scale)
        torch.manual_seed(1)
        found[scale] = find_perturbation(model, embeddings, model(embeddings), "squared", config)
    torch.testing.assert_close(found[1e-6], found[1.0], rtol=1e-6, atol=0)


def test_ascent_leaves_parameter_gradients_untouched():
    model = make_model()
    batch = make_batch("sentiment")
    embeddings = model.embed("sentiment", batch)
    outputs = model("sentiment", batch)
    config = SmartConfig(ascent_steps=3)
    find_perturbation(forward_fn_for(model, "sentiment", batch), embeddings, outputs, "categorical", config)
    adversarial_regularizer(forward_fn_for(model, "sentiment", batch), embeddings, outputs, "categorical", config)
    assert all(p.grad is None for p in model.parameters())


def test_adversarial_regularizer_backpropagates_into_the_weights():
    model = make_model()
    batch = make_batch("sentiment")
    embeddings = model.embed("sentiment", batch)
    outputs = model("sentiment", batch)
    config = SmartConfig(epsilon=1e-2, noise_std=1e-3)
    gradients = {}
    for clean_path in (True, False):
        model.zero_grad()
        torch.manual_seed(3)
        smoothness, skipped = adversarial_regularizer(
            forward_fn_for(model, "sentiment", batch),
            embeddings,
            outputs if clean_path else outputs.detach(),
            "categorical",
            config,
        )
        assert not skipped and smoothness.item() > 0
        smoothness.backward(retain_graph=True)
        # The perturbed forward alone reaches the embedding table (through e + delta) and the layers above.
        for p in (model.embedding.weight, model.encoder[0].weight, model.sentiment.weight):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
        gradients[clean_path] = model.embedding.weight.grad.clone()
    # ... and the clean outputs are not a constant target.
    assert not torch.allclose(gradients[True], gradients[False])


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_non_finite_ascent_is_skipped_and_counted(poison):
    model = make_model()
    batch = make_batch("paraphrase")
    regularizer = SmartRegularizer(model, SmartConfig(adv_weight=1.0, bregman_weight=1.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    embeddings = model.embed("paraphrase", batch)
    outputs = model.outputs_from_embeddings("paraphrase", embeddings, batch)

    def poisoned(perturbed):
        return model.outputs_from_embeddings("paraphrase", perturbed, batch) * poison

    assert adversarial_regularizer(poisoned, embeddings, outputs, "bernoulli", regularizer.config)[1]
    penalty = regularizer.penalty(poisoned, embeddings, outputs, "bernoulli", anchor_args=("paraphrase", batch))
    assert regularizer.skipped_steps == 1
    assert torch.isfinite(penalty)
    (task_loss("paraphrase", outputs, batch["labels"]) + penalty).backward()
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


# --- Bregman anchor -------------------------------------------------------------------------------------


@pytest.mark.parametrize("momentum", [0.99, 0.0])
def test_anchor_update_follows_the_momentum_formula(momentum):
    model = make_model()
    anchor = BregmanAnchor(model, momentum)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    before = {name: t.clone() for name, t in anchor.params.items()}
    anchor.update(model)
    for name, p in model.named_parameters():
        expected = (1 - momentum) * p.detach() + momentum * before[name]
        if momentum == 0:
            assert torch.equal(anchor.params[name], p.detach())
        else:
            torch.testing.assert_close(anchor.params[name], expected, rtol=1e-14, atol=1e-14)


def test_anchor_holds_parameter_copies_not_the_module():
    model = make_model()
    anchor = BregmanAnchor(model, 0.99)
    assert set(anchor.params) == {name for name, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert anchor.params[name].data_ptr() != p.data_ptr()
        assert not anchor.params[name].requires_grad


def test_anchor_matches_the_model_until_the_model_moves():
    model = make_model()
    batch = make_batch("similarity")
    anchor = BregmanAnchor(model, 0.99)
    remembered = anchor(model, "similarity", batch)
    assert model.training, "the anchor restores the model's train mode"
    model.eval()
    live = model("similarity", batch)
    model.train()
    assert torch.equal(live, remembered) and not remembered.requires_grad
    assert torch.equal(anchor(model, "similarity", batch), remembered), "no dropout noise in the target"

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    task_loss("similarity", live, batch["labels"]).backward()
    optimizer.step()
    model.eval()
    assert not torch.allclose(model("similarity", batch), anchor(model, "similarity", batch))

    # The buffer is read from the live model, not copied.
    model.similarity_scale.fill_(0.0)
    assert torch.equal(anchor(model, "similarity", batch), torch.zeros(4, dtype=torch.float64))


def test_anchor_state_dict_round_trips_through_safetensors(tmp_path):
    model = make_model()
    anchor = BregmanAnchor(model, 0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    anchor.update(model)
    save_file(anchor.state_dict(), tmp_path / "anchor.safetensors")

    restored = BregmanAnchor(make_model(seed=1), 0.9)
    restored.load_state_dict(load_file(tmp_path / "anchor.safetensors"))
    assert restored.params.keys() == anchor.params.keys()
    assert all(torch.equal(restored.params[name], anchor.params[name]) for name in anchor.params)

    with pytest.raises(ValueError, match="missing"):
        restored.load_state_dict({"embedding.weight": anchor.params["embedding.weight"]})
    wrong_shape = {name: t.clone() for name, t in anchor.params.items()}
    wrong_shape["sentiment.bias"] = torch.zeros(5, dtype=torch.float64)
    with pytest.raises(ValueError, match="shape"):
        restored.load_state_dict(wrong_shape)


# --- the regularizer in a training loop --------------------------------------------------------------


def train(config, optimizer_class, tasks=("sentiment", "paraphrase", "similarity"), steps=3):
    model = make_model(seed=0)
    optimizer = optimizer_class(model.parameters(), lr=1e-2)
    regularizer = SmartRegularizer(model, config) if config is not None else None
    torch.manual_seed(123)  # dropout masks
    for step in range(steps):
        for task in tasks:
            batch = make_batch(task, seed=step)
            optimizer.zero_grad()
            embeddings = model.embed(task, batch)
            forward_fn = forward_fn_for(model, task, batch)
            outputs = forward_fn(embeddings)
            loss = task_loss(task, outputs, batch["labels"])
            if regularizer is not None:
                loss = loss + regularizer.penalty(
                    forward_fn, embeddings, outputs, TASK_DIVERGENCE[task], anchor_args=(task, batch)
                )
            loss.backward()
            optimizer.step()
            if regularizer is not None and regularizer.anchor is not None:
                regularizer.anchor.update(model)
    return model, regularizer


@pytest.mark.parametrize("optimizer_class", [torch.optim.AdamW, torch.optim.SGD])
def test_zero_weights_reproduce_plain_training_exactly(optimizer_class):
    plain, _ = train(None, optimizer_class)
    regularized, regularizer = train(SmartConfig(adv_weight=0.0, bregman_weight=0.0), optimizer_class)
    assert regularizer.anchor is None
    for (name, p), q in zip(plain.named_parameters(), regularized.parameters()):
        assert torch.equal(p, q), name
    # The same loop with SMART switched on does move the weights differently.
    smart, regularizer = train(SmartConfig(epsilon=1e-3, noise_std=1e-4), optimizer_class)
    assert regularizer.skipped_steps == 0
    assert not all(torch.equal(p, q) for p, q in zip(plain.parameters(), smart.parameters()))


def test_penalty_is_the_weighted_sum_of_both_terms():
    model = make_model()
    model.eval()
    batch = make_batch("sentiment")
    config = SmartConfig(adv_weight=3.0, bregman_weight=0.5, epsilon=1e-3, noise_std=1e-4)
    regularizer = SmartRegularizer(model, config)
    with torch.no_grad():
        model.sentiment.weight.add_(0.3)  # so the anchor lags behind the model
    embeddings = model.embed("sentiment", batch)
    forward_fn = forward_fn_for(model, "sentiment", batch)
    outputs = forward_fn(embeddings)

    torch.manual_seed(7)
    smoothness, _ = adversarial_regularizer(forward_fn, embeddings, outputs, "categorical", config)
    proximity = symmetric_kl_categorical(outputs, regularizer.anchor(model, "sentiment", batch))
    torch.manual_seed(7)
    penalty = regularizer.penalty(forward_fn, embeddings, outputs, "categorical", anchor_args=("sentiment", batch))
    assert smoothness.item() > 0 and proximity.item() > 0
    assert penalty.item() == pytest.approx(3.0 * smoothness.item() + 0.5 * proximity.item(), rel=1e-12)


def test_zero_weights_skip_the_work_they_switch_off():
    model = make_model()
    batch = make_batch("sentiment")
    embeddings = model.embed("sentiment", batch)
    outputs = model.outputs_from_embeddings("sentiment", embeddings, batch)
    perturbed_calls, model_calls = [], []
    model.register_forward_hook(lambda *_: model_calls.append(1))

    def counting_forward(perturbed):
        perturbed_calls.append(1)
        return model.outputs_from_embeddings("sentiment", perturbed, batch)

    no_adversary = SmartRegularizer(model, SmartConfig(adv_weight=0.0, bregman_weight=1.0))
    no_adversary.penalty(counting_forward, embeddings, outputs, "categorical", anchor_args=("sentiment", batch))
    assert perturbed_calls == [] and model_calls == [1]

    no_anchor = SmartRegularizer(model, SmartConfig(adv_weight=1.0, bregman_weight=0.0, ascent_steps=2))
    model_calls.clear()
    no_anchor.penalty(counting_forward, embeddings, outputs, "categorical")
    assert no_anchor.anchor is None and model_calls == [] and len(perturbed_calls) == 3


def test_epsilon_zero_is_one_more_dropout_forward_without_ascent_or_random_start():
    """epsilon 0: R_s is the divergence of the clean outputs and a second forward of the same embeddings under its own
    dropout mask (R-Drop's consistency term); no ascent pass, no random draw but the second forward's dropout."""
    model = make_model(dropout=0.3)
    batch = make_batch("sentiment")
    embeddings = model.embed("sentiment", batch)
    outputs = model.outputs_from_embeddings("sentiment", embeddings, batch)
    calls = []

    def counting_forward(perturbed):
        calls.append(perturbed)
        return model.outputs_from_embeddings("sentiment", perturbed, batch)

    config = SmartConfig(epsilon=0.0, ascent_steps=3, reduction="max")
    torch.manual_seed(5)
    smoothness, skipped = adversarial_regularizer(counting_forward, embeddings, outputs, "categorical", config)
    torch.manual_seed(5)  # the same dropout mask for the forward R_s should have run
    second = model.outputs_from_embeddings("sentiment", embeddings, batch)
    assert not skipped and len(calls) == 1 and torch.equal(calls[0], embeddings)
    assert smoothness.item() > 0  # two dropout masks disagree
    torch.testing.assert_close(smoothness, reduced_divergence("categorical", second, outputs, "max"), rtol=0, atol=0)
    delta, finite = ascend(counting_forward, embeddings, outputs, "categorical", config)
    assert bool(finite) and not delta.any() and len(calls) == 1


def test_epsilon_zero_is_the_adversarial_path_with_a_zero_perturbation(monkeypatch):
    """The same R_s, reduction and gradients as epsilon > 0 whose ascent found delta = 0: only the ascent is gone."""
    model = make_model(dropout=0.3)
    batch = make_batch("paraphrase")
    embeddings = model.embed("paraphrase", batch)
    outputs = model.outputs_from_embeddings("paraphrase", embeddings, batch)
    values = []
    for epsilon in (0.0, 1e-5):
        with monkeypatch.context() as patch:
            if epsilon:
                patch.setattr(smart, "ascend", lambda *args: (torch.zeros_like(embeddings), torch.tensor(True)))
            torch.manual_seed(7)
            values.append(adversarial_regularizer(forward_fn_for(model, "paraphrase", batch), embeddings, outputs,
                                                  "bernoulli", SmartConfig(epsilon=epsilon, reduction="max"))[0])
    assert values[0].item() > 0
    torch.testing.assert_close(values[0], values[1], rtol=0, atol=0)


def test_regularizers_of_one_model_can_share_one_anchor():
    model = make_model()
    shared = BregmanAnchor(model, 0.99)
    first = SmartRegularizer(model, SmartConfig(), shared)
    second = SmartRegularizer(model, SmartConfig(adv_weight=5.0), shared)
    assert first.anchor is shared and second.anchor is shared
    assert SmartRegularizer(model, SmartConfig(bregman_weight=0.0), shared).anchor is None


def test_bregman_momentum_schedule():
    assert [bregman_momentum(u, 50) for u in (0, 4, 5, 49)] == [0.99, 0.99, 0.999, 0.999]
    assert [bregman_momentum(u, 7) for u in range(3)] == [0.99, 0.999, 0.999]  # 0.1 * 7 = 0.7: update 0 only
    assert bregman_momentum(0, 100, 0.9) == bregman_momentum(99, 100, 0.9) == 0.9
    assert bregman_momentum(3, 10, 0.0) == 0.0  # vanilla BPP stays fixed too


# ---------------------------------------------------------------------------------------------------
# Precision: SMART's passes in float32 whatever the run's autocast


def smoothness_term(model, task, batch, epsilon, context, monkeypatch) -> float:
    """R_s (dropout off) as the trainer's SMART step computes it under `context`, read where penalty() gets it."""
    import smart
    from minbert.training.objective import compute_task_loss
    from minbert.training.penalties.smart import SmartPenalty
    seen = []

    def recording(*args, **kwargs):
        result = adversarial_regularizer(*args, **kwargs)
        seen.append(result[0].item())
        return result
    monkeypatch.setattr(smart, "adversarial_regularizer", recording)
    torch.manual_seed(0)  # the same random start everywhere
    with context:
        regularizer = SmartRegularizer(model, SmartConfig(epsilon=epsilon, noise_std=epsilon, precision="exact"))
        compute_task_loss(model, task, batch, [SmartPenalty({task: regularizer})])
    monkeypatch.undo()
    return seen[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_smart_step_computes_in_float32_under_autocast(dtype, tokenizer):
    """The trainer's task step under bf16 (L4) or fp16 (T4) autocast: with SMART at precision exact, loss and
    penalty are exactly the float32 ones; the ascent gradient is a float32 one, so fp16 cannot underflow it. At
    the run's precision (the default) the same step computes under the autocast."""
    from minbert.training.objective import compute_task_loss
    from minbert.training.penalties.smart import SmartPenalty
    model = deterministic_tiny_model().eval()
    batch = sentence_batch(tokenizer, 8)
    values = {}
    for precision in ("exact", "run"):
        regularizer = SmartRegularizer(model, SmartConfig(precision=precision))
        for name, context in (("fp32", nullcontext()), ("autocast", torch.autocast("cpu", dtype=dtype))):
            torch.manual_seed(0)
            with context:
                values[precision, name] = compute_task_loss(model, "sst", batch, [SmartPenalty({"sst": regularizer})])[0].item()
    assert values["exact", "fp32"] == values["exact", "autocast"] == values["run", "fp32"]
    if dtype == torch.float16:  # fp16 would underflow the ascent's gradient: SMART computes exactly there too
        assert values["run", "autocast"] == values["run", "fp32"]
    else:
        assert values["run", "autocast"] != values["run", "fp32"]
        assert values["run", "autocast"] == pytest.approx(values["run", "fp32"], rel=0.05)


def test_at_epsilon_zero_the_exact_step_compares_two_float32_dropout_forwards_under_bf16(tokenizer, monkeypatch):
    """The ablation's rs_eps0 arm (cpu_forgetting_study.sh): under the run's bf16 autocast, --smart_precision exact
    computes the task loss's clean forward, which R_s compares with, in float32 too, and the second forward draws a
    dropout mask of its own; R_s is their divergence, reduced as configured."""
    from minbert.training.objective import compute_task_loss
    from minbert.training.penalties.smart import SmartPenalty
    model = tiny_model(dropout=0.3).train()
    batch = sentence_batch(tokenizer, 8)
    seen = {}

    def recording(forward_fn, embeddings, clean_outputs, *args, **kwargs):
        def second_forward(perturbed):
            seen.setdefault("second", []).append(forward_fn(perturbed))
            return seen["second"][-1]
        seen["clean"] = clean_outputs
        seen["value"], _ = adversarial_regularizer(second_forward, embeddings, clean_outputs, *args, **kwargs)
        return seen["value"], False
    monkeypatch.setattr(smart, "adversarial_regularizer", recording)
    config = SmartConfig(epsilon=0.0, bregman_weight=0.0, precision="exact", reduction="max")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compute_task_loss(model, "sst", batch, [SmartPenalty({"sst": SmartRegularizer(model, config)})])
    (second,) = seen["second"]
    assert seen["clean"].dtype == second.dtype == torch.float32
    assert not torch.equal(seen["clean"], second)  # two dropout masks
    assert seen["value"] > 0
    torch.testing.assert_close(seen["value"], reduced_divergence("categorical", second, seen["clean"], "max"),
                               rtol=0, atol=0)


def test_smart_refuses_to_run_under_autocast(tokenizer):
    model = deterministic_tiny_model().eval()
    batch = sentence_batch(tokenizer, 4)
    model.set_adapter("sst")
    inputs = model.encoder_inputs("sst", batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = model.embed(inputs)
        outputs = model.outputs_from_embeddings("sst", embeddings, inputs)
        with pytest.raises(RuntimeError, match="float32"):
            SmartRegularizer(model, SmartConfig(precision="exact")).penalty(
                lambda e: model.outputs_from_embeddings("sst", e, inputs), embeddings, outputs, "categorical")


def test_smoothness_term_of_a_real_model_survives_bf16_autocast(tokenizer, monkeypatch):
    """minilm-l6 (hidden 384): under raw bf16 autocast x + delta rounds back to x at the first matmul and R_s is
    rounding noise (hundreds of times the float32 value, and it does not grow with epsilon); the trainer's
    SMART step under bf16 gives the float32 R_s, which grows as epsilon^2 (the divergence is quadratic)."""
    from bert import BertModel
    from minbert.model.multitask_bert import MultitaskBERT
    model = MultitaskBERT(BertModel.from_pretrained("minilm-l6")).eval()
    batch = sentence_batch(tokenizer, 8)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    float32 = {eps: smoothness_term(model, "sst", batch, eps, nullcontext(), monkeypatch) for eps in (1e-5, 2e-5)}
    under_bf16 = {eps: smoothness_term(model, "sst", batch, eps, bf16, monkeypatch) for eps in (1e-5, 2e-5)}
    assert under_bf16 == float32
    assert 3 < float32[2e-5] / float32[1e-5] < 5
    with bf16:  # what the step computed before: the clean and perturbed passes in bf16
        model.set_adapter("sst")
        inputs = model.encoder_inputs("sst", batch)
        embeddings = model.embed(inputs)

        def forward(e):
            return model.outputs_from_embeddings("sst", e, inputs)
        torch.manual_seed(0)
        raw, _ = adversarial_regularizer(forward, embeddings, forward(embeddings), "categorical",
                                         SmartConfig(epsilon=1e-5, noise_std=1e-5))
    assert raw.item() > 30 * float32[1e-5]


def test_the_random_start_leaves_padding_alone_so_a_sentence_norm_counts_real_tokens_only():
    """With an l2 ball per sentence, noise at padding (which no output reads) would take part of the radius from
    the real tokens: with the attention mask the start is zero there, and the real tokens' perturbation reaches eps."""
    torch.manual_seed(0)
    mask = torch.zeros(2, 10)
    mask[:, :3] = 1  # 3 real tokens of 10 in each row
    embeddings, weight = torch.randn(2, 10, 64), torch.randn(64, 5)

    def forward_fn(e):
        return (e * mask.unsqueeze(-1)).sum(dim=1) @ weight  # (2, 5) logits from the real tokens alone

    config = SmartConfig(norm="l2", norm_level="sentence", epsilon=1e-5, noise_std=1e-5)
    delta, finite = ascend(forward_fn, embeddings, forward_fn(embeddings), "categorical", config, mask)
    assert bool(finite) and delta[mask == 0].abs().max() == 0
    real_norms = torch.linalg.vector_norm(delta * mask.unsqueeze(-1), dim=(1, 2))
    torch.testing.assert_close(real_norms, torch.full((2,), 1e-5), rtol=1e-4, atol=0)
