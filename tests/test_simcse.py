import numpy as np
import pytest
import torch

from simcse import pairwise_contrastive_loss, supervised_simcse_loss


def random_embeddings(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def cosine_np(u, v):
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))


def info_nce_np(anchor, candidates, temperature):
    """mean_i -log softmax_j(cos(anchor_i, candidates_j) / tau)[i]."""
    losses = []
    for i, a in enumerate(anchor):
        logits = {j: cosine_np(a, c) / temperature for j, c in enumerate(candidates)}
        losses.append(-logits[i] + np.log(sum(np.exp(value) for value in logits.values())))
    return np.mean(losses)


# --- losses --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.05, 0.5, 2.0])
def test_supervised_simcse_matches_hand_computation(temperature):
    a, p, n = (random_embeddings(5, 8, seed=s) for s in range(3))
    expected = info_nce_np(a.numpy(), np.concatenate([p.numpy(), n.numpy()]), temperature)
    got = supervised_simcse_loss(a, p, n, temperature=temperature)
    assert got.item() == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_supervised_simcse_without_hard_negatives_is_in_batch_info_nce(temperature):
    z1, z2 = random_embeddings(6, 4, seed=1), random_embeddings(6, 4, seed=2)
    expected = info_nce_np(z1.numpy(), z2.numpy(), temperature)
    assert supervised_simcse_loss(z1, z2, None, temperature).item() == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("temperature", [0.05, 0.3])
def test_pairwise_contrastive_matches_hand_computation(temperature):
    a, p, n = (random_embeddings(5, 8, seed=s) for s in range(3))
    expected = []
    for ai, pi, ni in zip(a.numpy(), p.numpy(), n.numpy()):
        positive, negative = np.exp(cosine_np(ai, pi) / temperature), np.exp(cosine_np(ai, ni) / temperature)
        expected.append(-np.log(positive / (positive + negative)))
    got = pairwise_contrastive_loss(a, p, n, temperature=temperature)
    assert got.item() == pytest.approx(np.mean(expected), rel=1e-10)


def test_pairwise_contrastive_has_no_in_batch_negatives():
    a, p, n = (random_embeddings(4, 8, seed=s) for s in range(3))
    one_at_a_time = [pairwise_contrastive_loss(a[i : i + 1], p[i : i + 1], n[i : i + 1]) for i in range(4)]
    assert pairwise_contrastive_loss(a, p, n).item() == pytest.approx(torch.stack(one_at_a_time).mean().item())


def test_losses_see_directions_only():
    a, p, n = (random_embeddings(4, 8, seed=s) for s in range(3))
    scales = torch.tensor([[0.5], [3.0], [10.0], [1.0]], dtype=torch.float64)
    assert supervised_simcse_loss(a * scales, p, n).item() == pytest.approx(supervised_simcse_loss(a, p, n).item())
    assert pairwise_contrastive_loss(a, p * scales, n).item() == pytest.approx(
        pairwise_contrastive_loss(a, p, n).item()
    )


def test_perfect_embeddings_beat_random_ones():
    batch = 6
    anchors = torch.eye(batch, 8, dtype=torch.float64)  # orthogonal sentences
    negatives = -anchors  # each hard negative points the opposite way
    a, p, n = (random_embeddings(batch, 8, seed=s) for s in range(3))
    assert supervised_simcse_loss(anchors, anchors, negatives) < supervised_simcse_loss(a, p, n)
    assert supervised_simcse_loss(anchors, anchors, negatives).item() < 1e-6
    assert pairwise_contrastive_loss(anchors, anchors, negatives) < pairwise_contrastive_loss(a, p, n)
    assert supervised_simcse_loss(anchors, anchors) < supervised_simcse_loss(a, p)


def test_gradients_are_finite_even_for_a_zero_embedding():
    a, p, n = (random_embeddings(4, 8, seed=s).requires_grad_() for s in range(3))
    with torch.no_grad():
        a[0] = 0.0
    losses = [
        supervised_simcse_loss(a, p, n),
        supervised_simcse_loss(a, p),
        pairwise_contrastive_loss(a, p, n),
    ]
    for loss in losses:
        a.grad = p.grad = n.grad = None
        loss.backward()
        assert torch.isfinite(loss)
        assert all(t.grad is None or torch.isfinite(t.grad).all() for t in (a, p, n))
        assert p.grad.abs().sum() > 0


def test_half_precision_embeddings_give_a_float32_loss():
    a, p, n = (random_embeddings(4, 8, seed=s).to(torch.bfloat16) for s in range(3))
    loss = supervised_simcse_loss(a, p, n)
    assert loss.dtype == torch.float32
    assert loss.item() == supervised_simcse_loss(a.float(), p.float(), n.float()).item()


@pytest.mark.parametrize("loss", [supervised_simcse_loss, pairwise_contrastive_loss])
def test_temperature_must_be_positive(loss):
    a = random_embeddings(2, 4)
    with pytest.raises(ValueError, match="temperature"):
        loss(a, a, a, temperature=0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logits_are_float32_under_autocast(dtype):
    """Under the training step's autocast the similarity matmul would run in 16 bits: at scale 20 its
    rounding moves logits by ~0.1. The losses must equal their float32 values."""
    a, p, n = (random_embeddings(16, 64, seed=s).float() for s in range(3))
    with torch.autocast("cpu", dtype=dtype):
        supervised, in_batch = supervised_simcse_loss(a, p, n), supervised_simcse_loss(a, p)
    assert supervised.dtype == in_batch.dtype == torch.float32
    assert supervised.item() == supervised_simcse_loss(a, p, n).item()
    assert in_batch.item() == supervised_simcse_loss(a, p).item()
