"""MultitaskBERT heads and losses, schedules, SMART settings, and whole CLI runs on data/demo.

Everything runs a tiny random BERT (hidden 32, 2 layers) with the real bert-base-uncased vocabulary
of the bundled minilm-l6 tokenizer, so the whole file takes seconds, not minutes.
"""
import json
import math
import random
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import multitask_classifier as mc
from base_bert import BertConfig, resolve_pretrained
from bert import BertModel
from datasets import collate_pairs, collate_sentences, load_pair_examples, load_sentence_examples
from evaluation import check_predictions_file
from multitask_classifier import (MultitaskBERT, Stage, UsageError, annealed_probabilities, build_schedule,
                                  cosent_loss, load_multitask_model, mean_pool, parse_args, parse_stage_list,
                                  regularized_tasks, smart_configs, task_loss)
from smart import SmartConfig
from test_loading import hf_state_dict
from tokenizer import BertTokenizer

DEMO = mc.ROOT / "data" / "demo"
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)
MAX_LENGTH = 32
TEST_FILES = {"sst": "ids-sst-{}.csv", "quora": "quora-{}.csv", "sts": "sts-{}.csv"}
SPLIT_FILES = {"dev": "dev", "test": "test-student"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model's kernels gain nothing from a second thread, and on a busy 2-core machine they
    spend most of their time waiting for it (a (80, 20, 32) linear: 0.4 ms alone, 20 ms with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained("minilm-l6")


def tiny_model(seed: int = 0, **heads) -> MultitaskBERT:
    torch.manual_seed(seed)
    return MultitaskBERT(BertModel(BertConfig(**TINY)), **heads)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A pretrained-style directory: random tiny weights under Hugging Face names, minilm's vocabulary."""
    directory = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    (directory / "config.json").write_text(json.dumps({**TINY, "model_type": "bert"}))
    save_file(hf_state_dict(BertModel(BertConfig(**TINY))), str(directory / "model.safetensors"))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        if (resolve_pretrained("minilm-l6") / name).is_file():
            shutil.copy(resolve_pretrained("minilm-l6") / name, directory / name)
    return directory


def demo_examples(task: str, split: str, n: int | None = None) -> list:
    path = DEMO / TEST_FILES[task].format(SPLIT_FILES.get(split, split))
    load = load_sentence_examples if task == "sst" else load_pair_examples
    return load(path, task, split)[:n]


def pair_batch(tokenizer, task: str = "sts", n: int = 6, cross: bool = False) -> dict:
    return collate_pairs(demo_examples(task, "dev", n), tokenizer, MAX_LENGTH, cross_encoder=cross)


# ---------------------------------------------------------------------------------------------------
# The model


@pytest.mark.parametrize("pair_encoder", ["sbert", "cross"])
def test_output_shapes_per_task(tokenizer, pair_encoder):
    model = tiny_model(pair_encoder=pair_encoder).eval()
    cross = pair_encoder == "cross"
    sentences = collate_sentences(demo_examples("sst", "dev", 5), tokenizer, MAX_LENGTH)
    assert model("sst", sentences).shape == (5, 5)
    for task in ("quora", "sts"):
        assert model(task, pair_batch(tokenizer, task, 6, cross)).shape == (6,)


def test_sbert_pair_batch_gives_the_same_u_v_as_encoding_each_side_alone(tokenizer):
    model = tiny_model().eval()
    batch = pair_batch(tokenizer, "sts", 8)
    assert batch["input_ids_1"].shape[1] != batch["input_ids_2"].shape[1]  # the sides really are padded apart
    with torch.no_grad():
        u = model.encode_sentences(batch["input_ids_1"], batch["attention_mask_1"])  # (B, H)
        v = model.encode_sentences(batch["input_ids_2"], batch["attention_mask_2"])  # (B, H)
        cosine = model("sts", batch)
        paraphrase_logit = model("quora", batch)
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


@pytest.mark.parametrize("objective", MultitaskBERT.SIMILARITY_OBJECTIVES)
def test_similarity_score_of_cosines_lies_on_0_to_5(objective):
    model = tiny_model(similarity_objective=objective)
    cosine = torch.linspace(-1, 1, 21)
    score = model.similarity_score(cosine)
    assert score.min() >= 0 and score.max() <= 5
    assert score[-1] == 5 and torch.all(score.diff() >= 0)
    if objective == "cosine":  # trained on label / 5: cos 0.5 is 2.5, negative cosines are 0
        assert score[15] == pytest.approx(2.5) and torch.all(score[:11] == 0)
    else:  # 2.5 cos + 2.5: strictly increasing, so no two cosines tie
        assert score[0] == 0 and score[10] == pytest.approx(2.5) and torch.all(score.diff() > 0)


def test_cross_encoder_similarity_score_is_5_sigmoid():
    model = tiny_model(pair_encoder="cross")
    logits = torch.tensor([-50.0, -1.0, 0.0, 2.0, 50.0])
    torch.testing.assert_close(model.similarity_score(logits), 5 * torch.sigmoid(logits))


@pytest.mark.parametrize("objective", MultitaskBERT.SIMILARITY_OBJECTIVES)
def test_course_prediction_api(tokenizer, objective):
    model = tiny_model(similarity_objective=objective).eval()
    sentences = collate_sentences(demo_examples("sst", "dev", 4), tokenizer, MAX_LENGTH)
    pairs = pair_batch(tokenizer, "sts", 4)
    pair_args = [pairs[k] for k in ("input_ids_1", "attention_mask_1", "input_ids_2", "attention_mask_2")]
    with torch.no_grad():
        torch.testing.assert_close(model.predict_sentiment(sentences["input_ids"], sentences["attention_mask"]),
                                   model("sst", sentences))
        torch.testing.assert_close(model.predict_paraphrase(*pair_args), model("quora", pairs))
        similarity = model.predict_similarity(*pair_args)
    torch.testing.assert_close(similarity, model.similarity_score(model("sts", pairs)))
    assert similarity.shape == (4,) and similarity.min() >= 0 and similarity.max() <= 5


def test_cross_encoder_reads_one_joint_encoding_with_segments(tokenizer):
    model = tiny_model(pair_encoder="cross").eval()
    batch = pair_batch(tokenizer, "sts", 4, cross=True)
    assert "input_ids_1" not in batch and batch["token_type_ids"].max() == 1
    with torch.no_grad():
        joint = model.bert.encode(model.bert.embed(batch["input_ids"], batch["token_type_ids"]),
                                  batch["attention_mask"])
        pooled = mean_pool(joint, batch["attention_mask"])  # (B, H)
        torch.testing.assert_close(model("sts", batch), model.similarity_head(pooled).squeeze(-1))
        torch.testing.assert_close(model("quora", batch), model.paraphrase_head(pooled).squeeze(-1))
        without_segments = model("sts", {**batch, "token_type_ids": torch.zeros_like(batch["token_type_ids"])})
    assert not torch.allclose(without_segments, model("sts", batch))


def test_cls_pooling_reads_the_first_token():
    hidden, mask = torch.randn(3, 4, 32), torch.ones(3, 4, dtype=torch.long)
    torch.testing.assert_close(tiny_model(pooling="cls").pool(hidden, mask), hidden[:, 0])


@pytest.mark.parametrize("option", [dict(pooling="max"), dict(pair_encoder="bi"), dict(similarity_objective="mse")])
def test_unknown_head_options_are_usage_errors(option):
    with pytest.raises(UsageError):
        tiny_model(**option)


# ---------------------------------------------------------------------------------------------------
# Losses


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
    sbert = SimpleNamespace(pair_encoder="sbert", similarity_objective="cosine")
    logits, classes = torch.randn(4, 5), torch.tensor([0, 4, 2, 1])
    assert task_loss(sbert, "sst", logits, classes).item() == pytest.approx(F.cross_entropy(logits, classes).item())
    logit, duplicate = torch.randn(4), torch.tensor([0.0, 1.0, 1.0, 0.0])
    expected = F.binary_cross_entropy_with_logits(logit, duplicate)
    assert task_loss(sbert, "quora", logit, duplicate).item() == pytest.approx(expected.item())

    cosine, similarity = torch.tensor([0.9, -0.2, 0.4, 0.0]), torch.tensor([5.0, 0.0, 2.0, 2.5])
    expected = {"cosine": F.mse_loss(cosine, similarity / 5),
                "shifted": F.mse_loss(cosine, (similarity - 2.5) / 2.5),
                "cosent": cosent_loss(cosine, similarity)}
    for objective, value in expected.items():
        model = SimpleNamespace(pair_encoder="sbert", similarity_objective=objective)
        assert task_loss(model, "sts", cosine, similarity).item() == pytest.approx(value.item()), objective
    cross = SimpleNamespace(pair_encoder="cross", similarity_objective="cosine")
    expected = F.mse_loss(torch.sigmoid(logit), similarity / 5)
    assert task_loss(cross, "sts", logit, similarity).item() == pytest.approx(expected.item())


# ---------------------------------------------------------------------------------------------------
# Schedules and SMART settings


def test_parse_stage_list_fractions_repeats_and_aliases():
    stages = parse_stage_list("qqp, sts*2 ,quora:0.03,para:0.5*2, sst")
    assert stages == [Stage("task", "quora"), Stage("task", "sts"), Stage("task", "sts"),
                      Stage("task", "quora", 0.03), Stage("task", "quora", 0.5), Stage("task", "quora", 0.5),
                      Stage("task", "sst")]
    assert [s.label for s in stages[:4]] == ["qqp", "sts", "sts", "qqp@0.03"]
    assert parse_stage_list("") == []


@pytest.mark.parametrize("text, problem", [
    ("qqp,mnli", "unknown stage 'mnli'"), ("sts:0", "fraction"), ("sts:1.5", "fraction"),
    ("sts:half", "task\\[:fraction\\]"), ("sts*0", "repeat count"), ("sts*two", "task\\[:fraction\\]"),
])
def test_parse_stage_list_errors(text, problem):
    with pytest.raises(UsageError, match=problem):
        parse_stage_list(text)


def test_build_schedule_sequential_simcse_and_multitask():
    args = parse_args(["--first_stages", "qqp", "--cycle", "sts,sst:0.5", "--cycles", "2"])
    assert [s.label for s in build_schedule(args)] == ["qqp", "sts", "sst@0.5", "sts", "sst@0.5"]
    args = parse_args(["--first_stages", "", "--cycles", "1", "--cycle", "sts", "--simcse_data", "x.csv",
                       "--simcse_epochs", "2"])
    assert [s.kind for s in build_schedule(args)] == ["simcse", "simcse", "task"]
    args = parse_args(["--schedule", "annealed", "--epochs", "3"])
    assert build_schedule(args) == [Stage("multitask", epoch=e) for e in (1, 2, 3)]
    with pytest.raises(UsageError, match="schedule is empty"):
        build_schedule(parse_args(["--first_stages", "", "--cycles", "0"]))


def test_annealed_probabilities_go_from_size_proportional_to_near_uniform():
    sizes = {"sst": 8544, "quora": 283003, "sts": 6040}
    first, last = annealed_probabilities(sizes, 1, 5), annealed_probabilities(sizes, 5, 5)
    for probabilities, alpha in ((first, 1.0), (last, 0.2)):
        assert sum(probabilities.values()) == pytest.approx(1.0)
        total = sum(n ** alpha for n in sizes.values())
        for task, n in sizes.items():
            assert probabilities[task] == pytest.approx(n ** alpha / total)
    middle = annealed_probabilities(sizes, 3, 5)
    assert last["quora"] < middle["quora"] < first["quora"]
    assert annealed_probabilities(sizes, 1, 1) == pytest.approx(first)


def test_smart_configs_apply_flags_then_per_task_overrides():
    args = parse_args(["--smart", "--smart_epsilon", "1e-4", "--smart_override", "sst:adv_weight=10,ascent_steps=2",
                       "--smart_override", "qqp:norm=l2"])
    configs = smart_configs(args)
    assert configs["sts"] == SmartConfig(epsilon=1e-4)
    assert configs["sst"] == SmartConfig(epsilon=1e-4, adv_weight=10.0, ascent_steps=2)
    assert configs["quora"] == SmartConfig(epsilon=1e-4, norm="l2")


@pytest.mark.parametrize("override, problem", [
    ("sst", "expected TASK:key=value"), ("mnli:adv_weight=1", "expected TASK:key=value"),
    ("sst:teacher_momentum=0.5", "shared setting 'teacher_momentum'"), ("sst:alpha=1", "unknown or shared"),
    ("sst:ascent_steps=two", "ascent_steps must be a int"), ("sts:epsilon=-1", "epsilon must be finite and > 0"),
])
def test_smart_override_errors(override, problem):
    with pytest.raises(UsageError, match=problem):
        smart_configs(parse_args(["--smart", "--smart_override", override]))


def test_regularized_tasks():
    assert regularized_tasks(parse_args(["--smart_tasks", "sst"])) == set()
    assert regularized_tasks(parse_args(["--smart", "--smart_tasks", "qqp, sts"])) == {"quora", "sts"}
    with pytest.raises(UsageError, match="unknown task 'nli'"):
        regularized_tasks(parse_args(["--smart", "--smart_tasks", "sst,nli"]))


def test_demo_settings_are_defaults_that_explicit_flags_override():
    args = parse_args(["--demo", "--cycles", "1", "--output", "elsewhere"])  # an abbreviated flag wins too
    assert (args.cycles, args.output_dir, args.smart, args.pretrained) == (1, "elsewhere", True, "minilm-l6")


# ---------------------------------------------------------------------------------------------------
# Whole runs through main()


def run_flags(checkpoint, out, *extra) -> list[str]:
    flags = ["--data_dir", str(DEMO), "--pretrained", str(checkpoint), "--option", "finetune", "--quiet",
             "--max_train_examples", "24", "--max_length", str(MAX_LENGTH), "--batch_size", "8", "--lr", "1e-3",
             "--smart", "--first_stages", "qqp", "--cycle", "sts,sst:0.5", "--cycles", "1",
             "--output_dir", str(out / "run")]
    for flag in mc.OUT_FLAGS.values():
        flags += [f"--{flag}", str(out / f"{flag}.csv")]
    return flags + list(extra)


def read_csv_outputs(out) -> dict[str, str]:
    return {flag: (out / f"{flag}.csv").read_text() for flag in mc.OUT_FLAGS.values()}


def test_end_to_end_with_smart(tiny_checkpoint, tokenizer, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path)) == 0
    run = tmp_path / "run"
    written = {}
    for (task, split), flag in mc.OUT_FLAGS.items():
        ids = [e.id for e in demo_examples(task, split)]
        written[(task, split)] = check_predictions_file(tmp_path / f"{flag}.csv", ids, task)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["pretrained", "qqp", "sts", "sst@0.5"]
    assert all(math.isfinite(r["train_loss"]) for r in records[1:])
    assert len(json.loads((run / "history.json").read_text())) == 4
    assert (run / "forgetting_matrix.png").stat().st_size > 0

    best = json.loads((run / "best.json").read_text())
    assert best["metrics"]["overall"] == max(r["overall"] for r in records[1:])
    model = load_multitask_model(run / "best").eval()
    sst, para, sts = (demo_examples(task, "dev") for task in ("sst", "quora", "sts"))
    with torch.no_grad():
        sentiment = model("sst", collate_sentences(sst, tokenizer, MAX_LENGTH)).argmax(-1)
        duplicate = model("quora", collate_pairs(para, tokenizer, MAX_LENGTH)) > 0
        similarity = model.similarity_score(model("sts", collate_pairs(sts, tokenizer, MAX_LENGTH)))
    assert [written[("sst", "dev")][e.id] for e in sst] == sentiment.tolist()
    assert [written[("quora", "dev")][e.id] for e in para] == duplicate.long().tolist()
    np.testing.assert_allclose([written[("sts", "dev")][e.id] for e in sts], similarity.numpy(), atol=1e-4)


def test_resume_ends_bitwise_equal_to_an_uninterrupted_run(tiny_checkpoint, tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert mc.main(run_flags(tiny_checkpoint, straight)) == 0
    assert mc.main(run_flags(tiny_checkpoint, interrupted, "--stop_after_stages", "2")) == 0
    assert json.loads((interrupted / "run" / "last.json").read_text())["next_stage"] == 2
    assert not (interrupted / "sst_dev_out.csv").exists()
    assert mc.main(run_flags(tiny_checkpoint, interrupted, "--resume")) == 0

    expected = load_file(straight / "run" / "last.safetensors")
    got = load_file(interrupted / "run" / "last.safetensors")
    assert expected.keys() == got.keys()
    assert any(k.startswith("teacher.") for k in expected) and any(k.startswith("optimizer.") for k in expected)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    def metrics_without_times(out):
        lines = (out / "run" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]
    assert metrics_without_times(straight) == metrics_without_times(interrupted)
    assert read_csv_outputs(straight) == read_csv_outputs(interrupted)


def test_resume_with_a_different_setup_is_a_clear_error(tiny_checkpoint, tmp_path, capsys):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    flags = [f for f in run_flags(tiny_checkpoint, tmp_path, "--resume") if f != "--smart"]
    assert mc.main(flags + ["--pair_encoder", "cross"]) == 2
    assert "cannot resume: 2 flag(s) differ" in capsys.readouterr().err


def test_resume_accepts_flags_that_do_not_change_the_result(tiny_checkpoint, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--stop_after_stages", "1")) == 0
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--resume", "--eval_batch_size", "7")) == 0


def test_checkpoint_halves_from_different_saves_are_detected(tmp_path):
    tensors = {"w": torch.zeros(2)}
    mc.atomic_save(tmp_path / "a", tensors, {"n": 1})
    mc.atomic_save(tmp_path / "b", tensors, {"n": 2})
    assert mc.read_checkpoint(tmp_path / "a")[1]["n"] == 1
    (tmp_path / "b.json").replace(tmp_path / "a.json")  # as if the JSON write of a later save finished alone
    with pytest.raises(mc.CheckpointError, match="come from different saves"):
        mc.read_checkpoint(tmp_path / "a")
    assert not list(tmp_path.glob("*.tmp"))


def test_annealed_schedule_end_to_end(tiny_checkpoint, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--schedule", "annealed", "--epochs", "2",
                             "--max_train_examples", "16")) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["pretrained", "multitask-1", "multitask-2"]
    for (task, split), flag in mc.OUT_FLAGS.items():
        check_predictions_file(tmp_path / f"{flag}.csv", [e.id for e in demo_examples(task, split)], task)


@pytest.fixture
def model_must_not_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was validated")
    monkeypatch.setattr(mc.BertModel, "from_pretrained", refuse)


def test_malformed_data_file_exits_2_naming_it_before_loading_the_model(tmp_path, capsys, model_must_not_load):
    data = tmp_path / "data"
    shutil.copytree(DEMO, data)
    broken = data / "sts-dev.csv"
    broken.write_text(broken.read_text() + "40\tabc\tone sentence\ta stray\tfield\t3.0\n")
    assert mc.main(["--data_dir", str(data), "--output_dir", str(tmp_path / "run"), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(broken) in lines[0] and "tab-separated fields" in lines[0]


@pytest.mark.parametrize("flags, problem", [
    (["--first_stages", "qqp,mnli"], "unknown stage 'mnli'"),
    (["--smart", "--smart_override", "sst:ascent_steps=two"], "ascent_steps"),
    (["--smart", "--smart_tasks", "sst,nli"], "unknown task 'nli'"),
    (["--simcse_data", "nli.csv", "--option", "pretrain"], "use --option finetune"),
])
def test_bad_flags_exit_2_before_loading_the_model(tmp_path, capsys, model_must_not_load, flags, problem):
    assert mc.main(["--data_dir", str(DEMO), "--output_dir", str(tmp_path / "run"), *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0]


def test_pretrain_option_freezes_bert_and_trains_the_heads(tiny_checkpoint, tmp_path):
    # The default schedule's STS stage has no trainable weight here (the SBERT cosine); it must not crash.
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--option", "pretrain")) == 0
    state = load_file(tmp_path / "run" / "last.safetensors")
    for key, value in BertModel.from_pretrained(tiny_checkpoint).state_dict().items():
        assert torch.equal(state[f"model.bert.{key}"], value), key
    trained_steps = json.loads((tmp_path / "run" / "last.json").read_text())["optimizer"]["steps"]
    assert len(trained_steps) == 4  # weight and bias of the sentiment and paraphrase heads


def test_simcse_without_triplets_exits_2(tmp_path, capsys, model_must_not_load):
    empty = tmp_path / "nli.csv"
    empty.write_text("premise,positive,negative\n")
    flags = ["--data_dir", str(DEMO), "--simcse_data", str(empty), "--option", "finetune"]
    assert mc.main(flags) == 2
    assert "no (premise, entailed, contradicted) triplets" in capsys.readouterr().err


def test_simcse_stage_trains_the_encoder(tiny_checkpoint, tmp_path):
    triplets = tmp_path / "triplets.csv"
    triplets.write_text("premise,positive,negative\n"
                        "A man is playing a guitar.,A person plays music.,Nobody is playing anything.\n"
                        "Two kids run on the beach.,Children are outside.,The kids are asleep indoors.\n"
                        "A woman is cooking pasta.,Someone is making food.,A woman is swimming.\n"
                        "A dog catches a ball.,An animal is playing.,The dog is sleeping.\n")
    flags = run_flags(tiny_checkpoint, tmp_path, "--simcse_data", str(triplets), "--first_stages", "",
                      "--cycles", "0", "--simcse_lr", "1e-3", "--batch_size", "2")
    assert mc.main(flags) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["pretrained", "simcse"] and math.isfinite(records[1]["train_loss"])
    trained = load_multitask_model(tmp_path / "run" / "best").bert.state_dict()
    initial = BertModel.from_pretrained(tiny_checkpoint).state_dict()
    assert not torch.equal(trained["encoder.layers.0.attention.qkv.weight"],
                           initial["encoder.layers.0.attention.qkv.weight"])
    assert torch.equal(trained["pooler.dense.weight"], initial["pooler.dense.weight"])  # unused: no gradient


def test_pcgrad_projects_conflicting_gradients_by_hand():
    g1 = [torch.tensor([1.0, 0.0])]
    g2 = [torch.tensor([-1.0, 1.0])]
    combined = mc.pcgrad_combine([g1, g2], random.Random(0))
    # g1 . g2 = -1 < 0: g1' = g1 - (-1/2) g2 = (0.5, 0.5); g2' = g2 - (-1/1) g1 = (0, 1); sum = (0.5, 1.5)
    torch.testing.assert_close(combined[0], torch.tensor([0.5, 1.5]))


def test_pcgrad_leaves_agreeing_gradients_alone():
    g1, g2 = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])], [torch.tensor([2.0, 0.0]), torch.tensor([1.0])]
    combined = mc.pcgrad_combine([g1, g2], random.Random(0))
    torch.testing.assert_close(combined[0], torch.tensor([3.0, 2.0]))
    torch.testing.assert_close(combined[1], torch.tensor([4.0]))


def test_pcgrad_result_never_conflicts_with_a_task_for_two_tasks():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        g1, g2 = [torch.randn(5, generator=generator)], [torch.randn(5, generator=generator)]
        combined = mc.pcgrad_combine([g1, g2], random.Random(0))[0]
        assert (combined @ g1[0]).item() >= -1e-6 and (combined @ g2[0]).item() >= -1e-6


def test_pcgrad_needs_round_robin(tiny_checkpoint, tmp_path, capsys):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--schedule", "annealed", "--pcgrad")) == 2
    assert "--pcgrad needs --schedule round_robin" in capsys.readouterr().err


def test_round_robin_with_pcgrad_runs_end_to_end(tiny_checkpoint, tmp_path):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--schedule", "round_robin", "--pcgrad", "--epochs", "1")) == 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [h["stage"] for h in history] == ["pretrained", "multitask-1"]


def test_resume_with_fewer_cycles_equals_the_shorter_run(tiny_checkpoint, tmp_path):
    short, cut = tmp_path / "short", tmp_path / "cut"
    assert mc.main(run_flags(tiny_checkpoint, short, "--cycles", "1")) == 0
    assert mc.main(run_flags(tiny_checkpoint, cut, "--cycles", "2", "--stop_after_stages", "2")) == 0
    assert mc.main(run_flags(tiny_checkpoint, cut, "--cycles", "1", "--resume")) == 0
    assert read_csv_outputs(short) == read_csv_outputs(cut)


def test_resume_refuses_a_schedule_that_does_not_extend_the_stages_done(tiny_checkpoint, tmp_path, capsys):
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--cycles", "2", "--stop_after_stages", "3")) == 0
    assert mc.main(run_flags(tiny_checkpoint, tmp_path, "--cycles", "0", "--resume")) == 2
    assert "do not begin this run's schedule" in capsys.readouterr().err


@pytest.mark.parametrize("flag, enabled", [(None, False), (True, True), (False, False)])
def test_bf16_autocast_on_cpu_only_when_asked(flag, enabled):
    with mc.bf16_autocast(torch.device("cpu"), flag):
        assert torch.is_autocast_enabled("cpu") == enabled
        assert (torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.bfloat16) == enabled


def test_bf16_flag_trains_in_bf16_on_cpu(tiny_checkpoint, tmp_path):
    losses = {}
    for precision in ("--no-bf16", "--bf16"):
        out = tmp_path / precision.strip("-")
        out.mkdir()
        assert mc.main(run_flags(tiny_checkpoint, out, precision)) == 0
        records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        losses[precision] = [r["train_loss"] for r in records[1:]]
    assert all(math.isfinite(loss) for loss in losses["--bf16"])
    # The same seed and data: only the autocast differs, so equal losses would mean the flag was ignored.
    assert losses["--bf16"] != losses["--no-bf16"]
    np.testing.assert_allclose(losses["--bf16"], losses["--no-bf16"], rtol=0.1)
