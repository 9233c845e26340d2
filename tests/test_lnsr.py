"""lnsr.py: the encoder entry point at a layer, and LNSR's penalty by hand."""
import pytest
import torch

from conftest import tiny_bert
from minbert.training.lnsr import LnsrConfig, encode_with_noise_stability

pytestmark = pytest.mark.usefixtures("one_thread")


def batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 2000, (3, 7), generator=generator)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return ids * mask, mask


def test_the_encoder_runs_from_any_layer_to_any_layer():
    bert = tiny_bert(num_hidden_layers=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    ids, mask = batch()
    embeddings = bert.embed(ids)
    full = bert.encode(embeddings, mask)
    outputs = []
    first = bert.encoder(embeddings, mask, end=1)
    rest = bert.encoder(first, mask, start=1, layer_outputs=outputs)
    torch.testing.assert_close(rest, full, rtol=0, atol=0)
    assert len(outputs) == 2
    torch.testing.assert_close(outputs[-1], full, rtol=0, atol=0)
    torch.testing.assert_close(outputs[0], bert.encoder(embeddings, mask, end=2), rtol=0, atol=0)


def test_penalty_equals_the_mean_squared_change_of_later_layers_by_hand():
    bert = tiny_bert(num_hidden_layers=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    ids, mask = batch()
    embeddings = bert.embed(ids)
    config = LnsrConfig(weight=0.3, layer=1, noise_std=0.05)
    torch.manual_seed(5)
    hidden, penalty = encode_with_noise_stability(bert.encoder, embeddings, mask, config)
    torch.testing.assert_close(hidden, bert.encode(embeddings, mask))  # the clean pass is the model's forward

    torch.manual_seed(5)
    injected = bert.encoder(embeddings, mask, end=1)
    noise = torch.randn_like(injected) * 0.05
    expected = 0.0
    for r in (2, 3):  # layers b + 1 .. L, each from the (noisy) output of layer 1
        clean = bert.encoder(injected, mask, start=1, end=r)
        noisy = bert.encoder(injected + noise, mask, start=1, end=r)
        real = mask.bool()
        expected += ((noisy - clean)[real] ** 2).sum(-1).mean()  # squared norm per real token, averaged
    torch.testing.assert_close(penalty, 0.3 * expected)


def test_both_passes_draw_the_same_dropout_masks():
    # With dropout on and a vanishing noise, a penalty that compared two dropout masks would stay large.
    bert = tiny_bert(num_hidden_layers=2, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3).train()
    ids, mask = batch(1)
    _, penalty = encode_with_noise_stability(bert.encoder, bert.embed(ids), mask, LnsrConfig(1.0, 0, 1e-30))
    assert penalty.item() < 1e-12


def test_penalty_trains_the_layers_above_the_injection_and_rejects_a_layer_out_of_range():
    bert = tiny_bert(num_hidden_layers=2)
    ids, mask = batch()
    _, penalty = encode_with_noise_stability(bert.encoder, bert.embed(ids), mask, LnsrConfig(1.0, 1, 0.1))
    penalty.backward()
    assert bert.encoder.layers[1].ffn_in.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="leaves no layer to measure"):
        encode_with_noise_stability(bert.encoder, bert.embed(ids), mask, LnsrConfig(1.0, 2, 0.1))
    with pytest.raises(ValueError, match="noise_std"):
        LnsrConfig(noise_std=0.0)
