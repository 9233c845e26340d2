"""losses.py's objectives, as each task picks them (minbert/tasks/: objective(options)): the loss, the score and the
prediction decided from it, and CoSENT by hand."""
import math

import pytest
import torch
import torch.nn.functional as F

from minbert.tasks import RUN_TASKS, TASKS
from minbert.tasks.losses import (SIMILARITY_OBJECTIVES, BinaryObjective, ClassificationObjective,
                                  CosineSimilarityObjective, CrossSimilarityObjective, SpanObjective, cosent_loss,
                                  ordinal_cross_entropy)


def task_objectives(pair_encoders: dict[str, str], similarity_objective: str = "cosine",
                    ordinal_weight: float = 0.0) -> dict:
    """Each trainable task's objective under these head options, as MultitaskBERT builds them."""
    options = {"pair_encoder": pair_encoders, "similarity_objective": similarity_objective,
               "sentiment_ordinal_weight": ordinal_weight, "sts_cosine_dropout": False}
    return {task: TASKS[task].model.objective(options) for task in RUN_TASKS}


def cosent_by_hand(cosine, labels, scale):
    total = 1.0
    for i in range(len(labels)):
        for j in range(len(labels)):
            if labels[i] > labels[j]:
                total += math.exp(scale * (cosine[j] - cosine[i]))
    return math.log(total)


@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_cosent_loss_matches_a_double_loop(scale):
    generator = torch.Generator().manual_seed(0)
    cosine = torch.rand(7, generator=generator, dtype=torch.float64) * 2 - 1
    labels = torch.tensor([0.0, 1.2, 3.0, 3.0, 5.0, 2.4, 1.2], dtype=torch.float64)
    got = cosent_loss(cosine, labels, scale)
    assert got.item() == pytest.approx(cosent_by_hand(cosine.tolist(), labels.tolist(), scale), rel=1e-12)


def test_cosent_loss_without_ordered_pairs_is_zero_with_finite_gradient():
    cosine = torch.tensor([0.3, -0.2, 0.9], requires_grad=True)
    loss = cosent_loss(cosine, torch.full((3,), 2.0))
    loss.backward()
    assert loss.item() == 0.0 and torch.all(cosine.grad == 0)


def test_cosent_loss_falls_when_the_ranking_is_right():
    labels = torch.tensor([0.0, 2.5, 5.0])
    assert cosent_loss(torch.tensor([-0.5, 0.0, 0.5]), labels) < cosent_loss(torch.tensor([0.5, 0.0, -0.5]), labels)


ALL_SBERT = {"qqp": "sbert", "sts": "sbert"}
ALL_CROSS = {"qqp": "cross", "sts": "cross"}


def test_ordinal_cross_entropy_on_hand_computed_values():
    # Logits log(p) give softmax p exactly; label 1: distances (1, 0, 1, 2, 3).
    p = torch.tensor([[0.1, 0.5, 0.2, 0.1, 0.1]])
    labels = torch.tensor([1])
    expected_distance = 0.1 * 1 + 0.5 * 0 + 0.2 * 1 + 0.1 * 2 + 0.1 * 3  # 0.8
    value = ordinal_cross_entropy(p.log(), labels, weight=0.5)
    assert value.item() == pytest.approx(-math.log(0.5) + 0.5 * expected_distance, rel=1e-6)
    # Two rows: the batch mean of each part.
    q = torch.tensor([[0.7, 0.1, 0.1, 0.05, 0.05]])
    both = ordinal_cross_entropy(torch.cat([p, q]).log(), torch.tensor([1, 4]), weight=2.0)
    second = -math.log(0.05) + 2.0 * (0.7 * 4 + 0.1 * 3 + 0.1 * 2 + 0.05 * 1)
    assert both.item() == pytest.approx((-math.log(0.5) + 2.0 * expected_distance + second) / 2, rel=1e-6)


def test_ordinal_objective_charges_far_mistakes_more_and_weight_zero_is_cross_entropy():
    labels = torch.tensor([0])
    near = torch.tensor([[0.0, 3.0, 0.0, 0.0, 0.0]])  # mass on class 1, next to the label
    far = torch.tensor([[0.0, 0.0, 0.0, 0.0, 3.0]])  # the same mass on class 4
    ordinal = ClassificationObjective(ordinal_weight=1.0)
    assert F.cross_entropy(near, labels) == pytest.approx(F.cross_entropy(far, labels))
    assert ordinal.loss(near, labels) < ordinal.loss(far, labels)
    logits, classes = torch.randn(6, 5), torch.randint(5, (6,))
    assert ClassificationObjective(0.0).loss(logits, classes) == F.cross_entropy(logits, classes)
    assert task_objectives(ALL_SBERT, ordinal_weight=0.3)["sst"] == ClassificationObjective(0.3)


def test_task_loss_per_task_and_objective():
    sbert = task_objectives(ALL_SBERT, "cosine")
    logits, classes = torch.randn(4, 5), torch.tensor([0, 4, 2, 1])
    assert sbert["sst"].loss(logits, classes).item() == pytest.approx(F.cross_entropy(logits, classes).item())
    logit, duplicate = torch.randn(4), torch.tensor([0.0, 1.0, 1.0, 0.0])
    expected = F.binary_cross_entropy_with_logits(logit, duplicate)
    assert sbert["qqp"].loss(logit, duplicate).item() == pytest.approx(expected.item())

    cosine, similarity = torch.tensor([0.9, -0.2, 0.4, 0.0]), torch.tensor([5.0, 0.0, 2.0, 2.5])
    expected = {"cosine": F.mse_loss(cosine, similarity / 5),
                "shifted": F.mse_loss(cosine, (similarity - 2.5) / 2.5),
                "cosent": cosent_loss(cosine, similarity)}
    for objective, value in expected.items():
        sts = task_objectives(ALL_SBERT, objective)["sts"]
        assert sts.loss(cosine, similarity).item() == pytest.approx(value.item()), objective
    cross = task_objectives(ALL_CROSS, "cosine")["sts"]
    expected = F.mse_loss(torch.sigmoid(logit), similarity / 5)
    assert cross.loss(logit, similarity).item() == pytest.approx(expected.item())


def test_task_objectives_per_pair_encoder():
    assert task_objectives(ALL_SBERT, "cosent") == {"sst": ClassificationObjective(), "qqp": BinaryObjective(),
                                                   "sts": CosineSimilarityObjective("cosent"), "qa": SpanObjective()}
    assert task_objectives(ALL_CROSS, "cosine")["sts"] == CrossSimilarityObjective()
    assert task_objectives({"qqp": "cross", "sts": "hybrid"}, "cosent")["sts"] == CosineSimilarityObjective("cosent")
    with pytest.raises(ValueError, match="cross-encoder"):
        task_objectives(ALL_CROSS, "shifted")
    with pytest.raises(ValueError, match="similarity objective"):
        CosineSimilarityObjective("mse")


def test_divergences_smart_compares_outputs_with():
    objectives = task_objectives(ALL_SBERT, "cosine")
    assert {task: o.divergence for task, o in objectives.items()} == {"sst": "categorical", "qqp": "bernoulli",
                                                                      "sts": "squared", "qa": "span"}
    assert task_objectives(ALL_CROSS, "cosine")["sts"].divergence == "squared"


def test_losses_are_computed_in_float32_from_bf16_outputs():
    logits = torch.randn(4, 5).bfloat16()
    loss = ClassificationObjective().loss(logits, torch.tensor([0, 1, 2, 3]))
    assert loss.dtype == torch.float32
    assert BinaryObjective().loss(torch.randn(4).bfloat16(), torch.ones(4)).dtype == torch.float32


def test_sentiment_and_paraphrase_scores_are_logits_and_decide_the_class():
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.0, 0.5], [3.0, 0.0, 0.0, 0.0, 0.0]]).bfloat16()
    sst, qqp = ClassificationObjective(), BinaryObjective()
    assert sst.score(logits).dtype == torch.float32 and torch.equal(sst.score(logits), logits.float())
    assert sst.decide(sst.score(logits)).tolist() == [1, 0]
    assert qqp.decide(qqp.score(torch.tensor([-0.1, 0.0, 0.2]))).tolist() == [0, 0, 1]


@pytest.mark.parametrize("pair_encoders", [ALL_SBERT, ALL_CROSS])
def test_a_similarity_is_its_own_prediction(pair_encoders):
    sts = task_objectives(pair_encoders, "cosine")["sts"]
    scores = sts.score(torch.linspace(-1, 1, 5))
    assert torch.equal(sts.decide(scores), scores)


@pytest.mark.parametrize("objective", SIMILARITY_OBJECTIVES)
def test_similarity_score_of_cosines_lies_on_0_to_5(objective):
    cosine = torch.linspace(-1, 1, 21)
    score = task_objectives(ALL_SBERT, objective)["sts"].score(cosine)
    assert score.min() >= 0 and score.max() <= 5
    assert score[-1] == 5 and torch.all(score.diff() >= 0)
    if objective == "cosine":  # trained on label / 5: cos 0.5 is 2.5, negative cosines are 0
        assert score[15] == pytest.approx(2.5) and torch.all(score[:11] == 0)
    else:  # 2.5 cos + 2.5: strictly increasing, so no two cosines tie
        assert score[0] == 0 and score[10] == pytest.approx(2.5) and torch.all(score.diff() > 0)


def test_cross_encoder_similarity_score_is_5_sigmoid():
    logits = torch.tensor([-50.0, -1.0, 0.0, 2.0, 50.0])
    torch.testing.assert_close(task_objectives(ALL_CROSS, "cosine")["sts"].score(logits), 5 * torch.sigmoid(logits))
