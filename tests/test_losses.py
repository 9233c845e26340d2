"""losses.py: each task's loss, how outputs decode into predictions, and CoSENT by hand."""
import math

import pytest
import torch
import torch.nn.functional as F

from losses import (SIMILARITY_OBJECTIVES, CosineSimilarityObjective, CrossSimilarityObjective, ParaphraseObjective,
                    SentimentObjective, cosent_loss, task_objectives)


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


def test_task_loss_per_task_and_objective():
    sbert = task_objectives("sbert", "cosine")
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
        sts = task_objectives("sbert", objective)["sts"]
        assert sts.loss(cosine, similarity).item() == pytest.approx(value.item()), objective
    cross = task_objectives("cross", "cosine")["sts"]
    expected = F.mse_loss(torch.sigmoid(logit), similarity / 5)
    assert cross.loss(logit, similarity).item() == pytest.approx(expected.item())


def test_task_objectives_per_pair_encoder():
    assert task_objectives("sbert", "cosent") == {"sst": SentimentObjective(), "qqp": ParaphraseObjective(),
                                                   "sts": CosineSimilarityObjective("cosent")}
    assert task_objectives("cross", "cosine")["sts"] == CrossSimilarityObjective()
    with pytest.raises(ValueError, match="cross-encoder"):
        task_objectives("cross", "shifted")
    with pytest.raises(ValueError, match="similarity objective"):
        CosineSimilarityObjective("mse")


def test_divergences_smart_compares_outputs_with():
    objectives = task_objectives("sbert", "cosine")
    assert {task: o.divergence for task, o in objectives.items()} == {"sst": "categorical", "qqp": "bernoulli",
                                                                      "sts": "squared"}
    assert task_objectives("cross", "cosine")["sts"].divergence == "squared"


def test_losses_are_computed_in_float32_from_bf16_outputs():
    logits = torch.randn(4, 5).bfloat16()
    loss = SentimentObjective().loss(logits, torch.tensor([0, 1, 2, 3]))
    assert loss.dtype == torch.float32
    assert ParaphraseObjective().loss(torch.randn(4).bfloat16(), torch.ones(4)).dtype == torch.float32


def test_sentiment_and_paraphrase_decoding():
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.0, 0.5], [3.0, 0.0, 0.0, 0.0, 0.0]])
    assert SentimentObjective().decode(logits).tolist() == [1, 0]
    assert ParaphraseObjective().decode(torch.tensor([-0.1, 0.0, 0.2])).tolist() == [0, 0, 1]


@pytest.mark.parametrize("objective", SIMILARITY_OBJECTIVES)
def test_similarity_score_of_cosines_lies_on_0_to_5(objective):
    decode = task_objectives("sbert", objective)["sts"].decode
    cosine = torch.linspace(-1, 1, 21)
    score = decode(cosine)
    assert score.min() >= 0 and score.max() <= 5
    assert score[-1] == 5 and torch.all(score.diff() >= 0)
    if objective == "cosine":  # trained on label / 5: cos 0.5 is 2.5, negative cosines are 0
        assert score[15] == pytest.approx(2.5) and torch.all(score[:11] == 0)
    else:  # 2.5 cos + 2.5: strictly increasing, so no two cosines tie
        assert score[0] == 0 and score[10] == pytest.approx(2.5) and torch.all(score.diff() > 0)


def test_cross_encoder_similarity_score_is_5_sigmoid():
    decode = task_objectives("cross", "cosine")["sts"].decode
    logits = torch.tensor([-50.0, -1.0, 0.0, 2.0, 50.0])
    torch.testing.assert_close(decode(logits), 5 * torch.sigmoid(logits))
