"""multitask_bert.py: MultitaskBERT's heads and forward pass on a tiny random BERT, saving and loading."""
import pytest
import torch
import torch.nn.functional as F

from base_bert import CheckpointError
from conftest import MAX_LENGTH, TINY, demo_examples, pair_batch, sentence_batch, tiny_model
from datasets import collate_sentences
from multitask_bert import load_multitask_model, mean_pool, model_metadata, save_multitask_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("pair_encoder", ["sbert", "cross"])
def test_output_shapes_per_task(tokenizer, pair_encoder):
    model = tiny_model(pair_encoder=pair_encoder).eval()
    cross = pair_encoder == "cross"
    sentences = collate_sentences(demo_examples("sst", "dev", 5), tokenizer, MAX_LENGTH)
    assert model("sst", sentences).shape == (5, 5)
    for task in ("qqp", "sts"):
        assert model(task, pair_batch(tokenizer, task, 6, cross)).shape == (6,)


def test_sbert_pair_batch_gives_the_same_u_v_as_encoding_each_side_alone(tokenizer):
    model = tiny_model().eval()
    batch = pair_batch(tokenizer, "sts", 8)
    assert batch["input_ids_1"].shape[1] != batch["input_ids_2"].shape[1]  # the sides really are padded apart
    with torch.no_grad():
        u = model.encode_sentences(batch["input_ids_1"], batch["attention_mask_1"])  # (B, H)
        v = model.encode_sentences(batch["input_ids_2"], batch["attention_mask_2"])  # (B, H)
        cosine = model("sts", batch)
        paraphrase_logit = model("qqp", batch)
    torch.testing.assert_close(cosine, F.cosine_similarity(u, v, dim=-1), atol=1e-6, rtol=1e-5)
    expected_logit = model.paraphrase_head(torch.cat([u, v, (u - v).abs()], dim=-1)).squeeze(-1)
    torch.testing.assert_close(paraphrase_logit, expected_logit, atol=1e-6, rtol=1e-5)


def test_mean_pool_ignores_padding():
    hidden = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    garbage = hidden.clone()
    garbage[0, 3:] = 1e6
    torch.testing.assert_close(mean_pool(garbage, mask)[0], hidden[0, :3].mean(dim=0))
    torch.testing.assert_close(mean_pool(garbage, mask)[1], hidden[1].mean(dim=0))


def test_sentence_embedding_does_not_depend_on_its_batch_padding(tokenizer):
    model = tiny_model().eval()
    short, long = "A dog runs.", "A man in a red coat is kicking a soccer ball on a crowded street."
    alone = tokenizer([short], padding=True, return_tensors="pt")
    padded = tokenizer([short, long], padding=True, return_tensors="pt")
    assert padded["input_ids"].shape[1] > alone["input_ids"].shape[1]
    with torch.no_grad():
        one = model.encode_sentences(alone["input_ids"], alone["attention_mask"])[0]
        among = model.encode_sentences(padded["input_ids"], padded["attention_mask"])[0]
    torch.testing.assert_close(one, among, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("objective", ["cosine", "shifted", "cosent"])
def test_course_prediction_api(tokenizer, objective):
    model = tiny_model(similarity_objective=objective).eval()
    sentences = collate_sentences(demo_examples("sst", "dev", 4), tokenizer, MAX_LENGTH)
    pairs = pair_batch(tokenizer, "sts", 4)
    pair_args = [pairs[k] for k in ("input_ids_1", "attention_mask_1", "input_ids_2", "attention_mask_2")]
    with torch.no_grad():
        torch.testing.assert_close(model.predict_sentiment(sentences["input_ids"], sentences["attention_mask"]),
                                   model("sst", sentences))
        torch.testing.assert_close(model.predict_paraphrase(*pair_args), model("qqp", pairs))
        similarity = model.predict_similarity(*pair_args)
    torch.testing.assert_close(similarity, model.objectives["sts"].decode(model("sts", pairs)))
    assert similarity.shape == (4,) and similarity.min() >= 0 and similarity.max() <= 5


@pytest.mark.parametrize("pair_encoder", ["sbert", "cross"])
def test_predict_decodes_each_task(tokenizer, pair_encoder):
    model = tiny_model(pair_encoder=pair_encoder).eval()
    cross = pair_encoder == "cross"
    sentences = sentence_batch(tokenizer, 4)
    with torch.no_grad():
        assert torch.equal(model.predict("sst", sentences), model("sst", sentences).argmax(-1))
        pairs = pair_batch(tokenizer, "qqp", 5, cross)
        assert torch.equal(model.predict("qqp", pairs), (model("qqp", pairs) > 0).long())
        pairs = pair_batch(tokenizer, "sts", 5, cross)
        score = model.predict("sts", pairs)
    assert score.shape == (5,) and score.min() >= 0 and score.max() <= 5


def test_cross_encoder_reads_one_joint_encoding_with_segments(tokenizer):
    model = tiny_model(pair_encoder="cross").eval()
    batch = pair_batch(tokenizer, "sts", 4, cross=True)
    assert "input_ids_1" not in batch and batch["token_type_ids"].max() == 1
    with torch.no_grad():
        joint = model.bert.encode(model.bert.embed(batch["input_ids"], batch["token_type_ids"]),
                                  batch["attention_mask"])
        pooled = mean_pool(joint, batch["attention_mask"])  # (B, H)
        torch.testing.assert_close(model("sts", batch), model.similarity_head(pooled).squeeze(-1))
        torch.testing.assert_close(model("qqp", batch), model.paraphrase_head(pooled).squeeze(-1))
        without_segments = model("sts", {**batch, "token_type_ids": torch.zeros_like(batch["token_type_ids"])})
    assert not torch.allclose(without_segments, model("sts", batch))


def test_cls_pooling_reads_the_first_token():
    hidden, mask = torch.randn(3, 4, 32), torch.ones(3, 4, dtype=torch.long)
    torch.testing.assert_close(tiny_model(pooling="cls").pool(hidden, mask), hidden[:, 0])


@pytest.mark.parametrize("option, problem", [(dict(pooling="max"), "pooling"), (dict(pair_encoder="bi"), "pair encoder"),
                                             (dict(similarity_objective="mse"), "similarity_objective"),
                                             (dict(head_activation="swish"), "head_activation")])
def test_unknown_head_options_are_value_errors(option, problem):
    with pytest.raises(ValueError, match=problem):
        tiny_model(**option)


def test_cross_encoder_refuses_a_cosine_objective_other_than_the_default():
    with pytest.raises(ValueError, match="cross-encoder"):
        tiny_model(pair_encoder="cross", similarity_objective="cosent")


def test_shared_parameters_are_the_encoder_and_only_the_encoder():
    model = tiny_model()
    shared = {name for name, _ in model.named_parameters() if model.is_shared(name)}
    assert shared == {f"bert.{name}" for name, _ in model.bert.named_parameters()}
    heads = {name for name, _ in model.named_parameters()} - shared
    assert heads == {"sentiment_head.weight", "sentiment_head.bias", "paraphrase_head.weight", "paraphrase_head.bias"}


def test_which_tasks_read_pairs_jointly():
    assert not any(tiny_model().reads_pairs_jointly(task) for task in ("sst", "qqp", "sts"))
    cross = tiny_model(pair_encoder="cross")
    assert [cross.reads_pairs_jointly(task) for task in ("sst", "qqp", "sts")] == [False, True, True]


def test_encoder_inputs_stack_both_sbert_sides_into_one_batch(tokenizer):
    model = tiny_model()
    batch = pair_batch(tokenizer, "sts", 5)
    inputs = model.encoder_inputs("sts", batch)
    length = max(batch["input_ids_1"].shape[1], batch["input_ids_2"].shape[1])
    assert inputs.input_ids.shape == inputs.attention_mask.shape == (10, length)
    assert inputs.token_type_ids is None
    assert torch.equal(inputs.attention_mask.sum(1), torch.cat([batch["attention_mask_1"].sum(1),
                                                                 batch["attention_mask_2"].sum(1)]))


@pytest.mark.parametrize("heads", [dict(), dict(pair_encoder="cross", pooling="cls", dropout=0.2),
                                   dict(similarity_objective="cosent")])
def test_save_and_load_round_trip_without_the_pretrained_source(tmp_path, tokenizer, heads):
    model = tiny_model(seed=3, **heads).eval()
    save_multitask_model(model, tmp_path / "best", {"metrics": {"overall": 0.5}})
    loaded = load_multitask_model(tmp_path / "best").eval()
    assert loaded.head_options() == model.head_options()
    assert model_metadata(loaded) == model_metadata(model)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_loading_a_checkpoint_of_something_else_is_a_checkpoint_error(tmp_path):
    from checkpoint import atomic_save
    atomic_save(tmp_path / "other", {"w": torch.zeros(2)}, {"bert_config": TINY, "heads": {"pooling": "max"}})
    with pytest.raises(CheckpointError, match="does not describe a MultitaskBERT"):
        load_multitask_model(tmp_path / "other")
