"""minBERT against Hugging Face transformers (the oracle), and its invariances."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from base_bert import BertConfig  # noqa: E402
from bert import BertModel  # noqa: E402
from tokenizer import BertTokenizer  # noqa: E402

SENTENCES = [
    "hello world",
    "The gorgeously elaborate continuation of The Lord of the Rings trilogy is so huge.",
    "What is the best way to learn machine learning from scratch?",
    "",
]

TINY_CONFIGS = [
    dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
    dict(vocab_size=211, hidden_size=48, num_hidden_layers=3, num_attention_heads=3, intermediate_size=80,
         max_position_embeddings=40, type_vocab_size=3),
]


def masked_max_diff(ours, reference, mask):
    return ((ours - reference) * mask[..., None]).abs().max().item()


def random_batch(vocab_size, batch=3, length=11, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (batch, length), generator=generator)
    lengths = torch.tensor([length, length - 4, 2])[:batch]
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = ids * mask  # padding id 0 beyond each length
    types = torch.randint(0, 2, (batch, length), generator=generator) * mask
    return ids, mask, types


@pytest.fixture(scope="module")
def minilm():
    ours = BertModel.from_pretrained("minilm-l6").eval()
    from base_bert import resolve_pretrained
    reference = transformers.BertModel.from_pretrained(str(resolve_pretrained("minilm-l6"))).eval()
    return ours, reference


def test_minilm_matches_transformers(minilm):
    ours, reference = minilm
    batch = BertTokenizer.from_pretrained("minilm-l6")(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        mine = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        theirs = reference(**batch)
    assert masked_max_diff(mine["last_hidden_state"], theirs.last_hidden_state, batch["attention_mask"]) < 1e-5
    assert (mine["pooler_output"] - theirs.pooler_output).abs().max().item() < 1e-5


@pytest.mark.parametrize("sizes", TINY_CONFIGS)
@pytest.mark.parametrize("weight_format", ["safetensors", "bin"])
def test_random_config_matches_transformers(tmp_path, sizes, weight_format):
    torch.manual_seed(0)
    reference = transformers.BertModel(transformers.BertConfig(**sizes)).eval()
    reference.save_pretrained(tmp_path)
    if weight_format == "bin":
        # A classic pytorch_model.bin, as older transformers wrote it, with the "bert." prefix
        # and a masked-LM head of a pretraining checkpoint that the encoder must ignore.
        (tmp_path / "model.safetensors").unlink()
        state = {f"bert.{k}": v for k, v in reference.state_dict().items()}
        state["cls.predictions.bias"] = torch.zeros(sizes["vocab_size"])
        torch.save(state, tmp_path / "pytorch_model.bin")
    ours = BertModel.from_pretrained(tmp_path).eval()
    ids, mask, types = random_batch(sizes["vocab_size"])
    with torch.no_grad():
        mine = ours(ids, mask, types)
        theirs = reference(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert masked_max_diff(mine["last_hidden_state"], theirs.last_hidden_state, mask) < 1e-5
    assert (mine["pooler_output"] - theirs.pooler_output).abs().max().item() < 1e-5


def test_gamma_beta_layer_norm_names_load(tmp_path):
    torch.manual_seed(0)
    reference = transformers.BertModel(transformers.BertConfig(**TINY_CONFIGS[0])).eval()
    reference.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in reference.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = BertModel.from_pretrained(tmp_path)
    assert torch.equal(ours.embeddings.layer_norm.weight, reference.embeddings.LayerNorm.weight)


def tiny_model(**overrides):
    torch.manual_seed(0)
    return BertModel(BertConfig(**{**TINY_CONFIGS[0], **overrides})).eval()


def test_padding_does_not_change_a_sentence():
    model = tiny_model()
    ids = torch.tensor([[5, 17, 23, 42, 9]])
    alone = model(ids, torch.ones_like(ids))
    padded_ids = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    padded_mask = (padded_ids != 0).long()
    batch_ids = torch.cat([padded_ids, torch.randint(1, 97, (1, 11))])
    batch_mask = torch.cat([padded_mask, torch.ones(1, 11, dtype=torch.long)])
    with torch.no_grad():
        together = model(batch_ids, batch_mask)
    torch.testing.assert_close(together["last_hidden_state"][0, :5], alone["last_hidden_state"][0],
                               atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(together["pooler_output"][0], alone["pooler_output"][0], atol=1e-6, rtol=1e-5)


def test_manual_attention_equals_sdpa():
    sdpa, manual = tiny_model(), tiny_model(attn_implementation="manual")
    manual.load_state_dict(sdpa.state_dict())
    ids, mask, types = random_batch(97)
    with torch.no_grad():
        a, b = sdpa(ids, mask, types), manual(ids, mask, types)
    assert masked_max_diff(a["last_hidden_state"], b["last_hidden_state"], mask) < 1e-5


def test_attention_gets_no_mask_when_the_batch_has_no_padding(monkeypatch):
    """SDPA's flash kernel accepts no mask: a batch without padding (length bucketing makes them common) must
    pass none, and a padded one still its key mask; the manual attention agrees in both cases."""
    import torch.nn.functional as F
    masks = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model, manual = tiny_model(), tiny_model(attn_implementation="manual")
    ids, mask, _ = random_batch(97)
    full = torch.ones_like(mask)
    with torch.no_grad():
        for attention_mask in (full, mask):
            masks.clear()
            ours = model(ids, attention_mask)["last_hidden_state"]
            assert all((m is None) == bool(attention_mask.all()) for m in masks) and masks
            reference = manual(ids, attention_mask)["last_hidden_state"]
            assert masked_max_diff(ours, reference, attention_mask) < 1e-5


def test_embed_encode_split_equals_forward_and_exposes_embeddings():
    model = tiny_model()
    ids, mask, types = random_batch(97)
    embeddings = model.embed(ids, types)
    assert embeddings.shape == (*ids.shape, 32)
    torch.testing.assert_close(model.encode(embeddings, mask), model(ids, mask, types)["last_hidden_state"])


def test_missing_token_types_mean_segment_zero():
    model = tiny_model()
    ids, mask, _ = random_batch(97)
    torch.testing.assert_close(model(ids, mask)["pooler_output"],
                               model(ids, mask, torch.zeros_like(ids))["pooler_output"])


def test_dropout_active_only_in_training():
    model = tiny_model(hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)
    ids, mask, types = random_batch(97)
    with torch.no_grad():
        assert torch.equal(model(ids, mask)["pooler_output"], model(ids, mask)["pooler_output"])
        model.train()
        assert not torch.equal(model(ids, mask)["pooler_output"], model(ids, mask)["pooler_output"])


def test_gradients_reach_every_parameter():
    model = tiny_model().train()
    ids, mask, types = random_batch(97)
    output = model(ids, mask, types)
    (output["last_hidden_state"].sum() + output["pooler_output"].sum()).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert no_grad == []


def test_bf16_autocast_stays_close():
    model = tiny_model()
    ids, mask, types = random_batch(97)
    with torch.no_grad():
        full = model(ids, mask, types)["pooler_output"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(ids, mask, types)["pooler_output"]
    assert half.dtype == torch.bfloat16
    assert (half.float() - full).abs().max().item() < 0.05


def test_too_long_input_is_a_clear_error():
    model = tiny_model(max_position_embeddings=8)
    with pytest.raises(ValueError, match="longer than the model's 8 positions"):
        model(torch.ones(1, 9, dtype=torch.long), torch.ones(1, 9, dtype=torch.long))


def test_gradient_checkpointing_gives_the_same_outputs_and_gradients():
    from conftest import tiny_bert
    ids, mask, types = random_batch(30522)
    results = []
    for checkpointed in (False, True):
        bert = tiny_bert(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2).train()  # dropout on
        bert.encoder.gradient_checkpointing = checkpointed
        calls, first = [], bert.encoder.layers[0]
        first.forward = lambda *inputs, run=first.forward: calls.append(1) or run(*inputs)
        torch.manual_seed(3)
        hidden = bert(ids, mask, types)["last_hidden_state"]
        hidden.pow(2).sum().backward()
        assert len(calls) == (2 if checkpointed else 1)  # recomputed in the backward pass
        results.append((hidden.detach(), {n: p.grad for n, p in bert.named_parameters() if p.grad is not None}))
    (plain, plain_grads), (recomputed, recomputed_grads) = results
    assert torch.equal(plain, recomputed)
    assert plain_grads.keys() == recomputed_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(recomputed_grads[name], plain_grads[name], rtol=1e-5, atol=1e-7)
