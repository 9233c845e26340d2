"""multitask_bert.py: MultitaskBERT's heads and forward pass on a tiny random BERT, saving and loading."""
import pytest
import torch
import torch.nn.functional as F

from base_bert import CheckpointError
from conftest import MAX_LENGTH, TINY, demo_examples, pair_batch, sentence_batch, tiny_model
from minbert.data.batches import collate_pairs, collate_sentences
from minbert.model.multitask_bert import (join_pairs, load_multitask_model, model_metadata, parse_pair_encoders,
                                          save_multitask_model)
from minbert.model.readout import mean_pool

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("pair_encoder", ["sbert", "cross", "hybrid"])
def test_output_shapes_per_task(tokenizer, pair_encoder):
    model = tiny_model(pair_encoder=pair_encoder).eval()
    cross = pair_encoder != "sbert"
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
    torch.testing.assert_close(similarity, model.objectives["sts"].score(model("sts", pairs)))
    assert similarity.shape == (4,) and similarity.min() >= 0 and similarity.max() <= 5


@pytest.mark.parametrize("pair_encoder", ["sbert", "cross", "hybrid"])
def test_predict_decodes_each_task(tokenizer, pair_encoder):
    model = tiny_model(pair_encoder=pair_encoder).eval()
    cross = pair_encoder != "sbert"
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


def test_pair_encoders_parse_for_both_tasks_or_per_task():
    assert parse_pair_encoders("cross") == {"qqp": "cross", "sts": "cross"}
    assert parse_pair_encoders("quora:cross, sts:hybrid") == {"qqp": "cross", "sts": "hybrid"}
    assert parse_pair_encoders("sts:hybrid") == {"qqp": "sbert", "sts": "hybrid"}
    for bad in ("bi", "sst:cross", "qqp:bi", "qqp"):
        with pytest.raises(ValueError):
            parse_pair_encoders(bad if bad != "qqp" else "qqp:")


def test_per_task_pair_encoders_read_their_own_batches(tokenizer):
    model = tiny_model(pair_encoder="qqp:cross,sts:sbert").eval()
    assert model.reads_pairs_jointly("qqp") and not model.reads_pairs_jointly("sts")
    assert not model.reads_pairs_jointly("sst") and not hasattr(model, "similarity_head")
    assert model.paraphrase_head.in_features == TINY["hidden_size"]  # cross: one pooled pair
    with torch.no_grad():
        assert model("qqp", pair_batch(tokenizer, "qqp", 4, cross=True)).shape == (4,)
        assert model("sts", pair_batch(tokenizer, "sts", 4)).shape == (4,)


def test_hybrid_pools_each_sentence_of_the_joint_encoding_apart(tokenizer):
    model = tiny_model(pair_encoder="hybrid").eval()
    batch = pair_batch(tokenizer, "sts", 4, cross=True)
    with torch.no_grad():
        joint = model.bert.encode(model.bert.embed(batch["input_ids"], batch["token_type_ids"]),
                                  batch["attention_mask"])  # (B, T, H)
        expected_cosine, expected_logit = [], []
        for row in range(4):
            real = batch["attention_mask"][row].bool()
            first = joint[row][real & (batch["token_type_ids"][row] == 0)].mean(0)  # [CLS] s1 [SEP]
            second = joint[row][real & (batch["token_type_ids"][row] == 1)].mean(0)  # s2 [SEP]
            expected_cosine.append(F.cosine_similarity(first, second, dim=0))
            expected_logit.append(model.paraphrase_head(torch.cat([first, second, (first - second).abs()])))
        torch.testing.assert_close(model("sts", batch), torch.stack(expected_cosine), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(model("qqp", batch), torch.cat(expected_logit), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("pair_encoder", ["cross", "hybrid"])
def test_course_api_joins_separately_tokenised_pairs_for_a_joint_encoder(tokenizer, pair_encoder):
    model = tiny_model(pair_encoder=pair_encoder).eval()
    examples = demo_examples("sts", "dev", 5)  # 64 tokens: no pair is truncated, so both ways agree
    separate, joint = collate_pairs(examples, tokenizer, 64), collate_pairs(examples, tokenizer, 64, cross_encoder=True)
    built = join_pairs(separate)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(built[key], joint[key]), key
    args = [separate[k] for k in ("input_ids_1", "attention_mask_1", "input_ids_2", "attention_mask_2")]
    with torch.no_grad():
        torch.testing.assert_close(model.predict_paraphrase(*args), model("qqp", joint))


def test_dense_heads_sit_between_the_features_and_each_output(tokenizer):
    model = tiny_model(head_hidden=16, head_activation="relu", dropout=0.0).eval()
    assert set(model.dense_heads) == {"sst", "qqp", "sts"}
    assert model.sentiment_head.in_features == 16 and model.paraphrase_head.in_features == 16
    assert model.dense_heads["qqp"][0].in_features == 3 * TINY["hidden_size"]  # [u, v, |u - v|]
    sentences, pairs = sentence_batch(tokenizer, 3), pair_batch(tokenizer, "sts", 3)
    with torch.no_grad():
        pooled = model.encode_sentences(sentences["input_ids"], sentences["attention_mask"])
        dense = model.dense_heads["sst"]
        expected = model.sentiment_head(torch.relu(dense[0](pooled)))
        torch.testing.assert_close(model("sst", sentences), expected)
        u = model.dense_heads["sts"](model.encode_sentences(pairs["input_ids_1"], pairs["attention_mask_1"]))
        v = model.dense_heads["sts"](model.encode_sentences(pairs["input_ids_2"], pairs["attention_mask_2"]))
        torch.testing.assert_close(model("sts", pairs), F.cosine_similarity(u, v, dim=-1), atol=1e-6, rtol=1e-5)
    assert not model.is_shared("dense_heads.sst.0.weight")


def test_head_options_round_trip_through_a_checkpoint(tmp_path, tokenizer):
    model = tiny_model(pair_encoder="qqp:hybrid,sts:cross", head_hidden=8, sentiment_ordinal_weight=0.5).eval()
    save_multitask_model(model, tmp_path / "m", {})
    loaded = load_multitask_model(tmp_path / "m").eval()
    assert loaded.head_options() == model.head_options()
    assert loaded.objectives["sst"].ordinal_weight == 0.5
    batch = pair_batch(tokenizer, "qqp", 3, cross=True)
    with torch.no_grad():
        assert torch.equal(loaded("qqp", batch), model("qqp", batch))


def test_cls_pooling_reads_the_first_token():
    hidden, mask = torch.randn(3, 4, 32), torch.ones(3, 4, dtype=torch.long)
    torch.testing.assert_close(tiny_model(pooling="cls").readout.pool(hidden, mask), hidden[:, 0])


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


@pytest.mark.parametrize("heads", [dict(), dict(pair_encoder="hybrid"), dict(pair_encoder="cross"),
                                   dict(head_hidden=8), dict(adapter=dict(kind="lora", rank=2))])
def test_trains_with_frozen_encoder_says_whether_a_frozen_bert_leaves_sts_anything_to_train(tokenizer, heads):
    from minbert.model.multitask_bert import freeze_encoder
    from minbert.training.objective import compute_task_loss
    model = tiny_model(**heads)
    freeze_encoder(model)
    batch = pair_batch(tokenizer, "sts", 3, cross=model.reads_pairs_jointly("sts"))
    assert model.trains_with_frozen_encoder("sts") == compute_task_loss(model, "sts", batch)[0].requires_grad
    assert all(model.trains_with_frozen_encoder(task) for task in ("sst", "qqp"))


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
    from minbert.model.checkpoint import atomic_save
    atomic_save(tmp_path / "other", {"w": torch.zeros(2)}, {"bert_config": TINY, "heads": {"pooling": "max"}})
    with pytest.raises(CheckpointError, match="does not describe a MultitaskBERT"):
        load_multitask_model(tmp_path / "other")
