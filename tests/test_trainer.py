"""trainer.py on a tiny random model: losses, PCGrad steps, gradient accumulation, the learning-rate and SMART
momentum schedules across a run, restarting loaders, weight-decay groups and evaluation."""
import math
import random

import numpy as np
import pytest
import torch

from conftest import MAX_LENGTH, demo_examples, deterministic_tiny_model, pair_batch, sentence_batch, tiny_model
from minbert.data.batches import TaskData, collate_sentences, make_dataloader
from minbert.model.checkpoint import read_checkpoint
from minbert.prediction.inference import predict_examples
from minbert.run.run_setup import build_trainer
from minbert.run.training_args import TrainingArguments
from minbert.training.gradient_surgery import cagrad_combine, pcgrad_combine
from minbert.training.loop import tasks_together
from minbert.training.schedules import Stage, StageKind, learning_rate_factor
from minbert.training.stage_data import RestartingLoaders
from minbert.training.trainer import Trainer
from minbert.training.objective import compute_task_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def demo_data(train: int = 16, dev: int = 8, test: int = 4) -> dict[str, TaskData]:
    return {task: TaskData(demo_examples(task, "train", train), demo_examples(task, "dev", dev),
                           demo_examples(task, "test", test)) for task in ("sst", "qqp", "sts")}


def make_trainer(tmp_path, tokenizer, model=None, data=None, **settings) -> Trainer:
    # float32 unless a test asks otherwise: the default (auto) is bf16 on a CPU with native bf16, and these tests
    # compare gradients to float32 precision.
    settings = {"option": "finetune", "batch_size": 4, "lr": 1e-3, "max_length": MAX_LENGTH, "quiet": True,
                "precision": "fp32", "output_dir": str(tmp_path / "run"), **settings}
    return build_trainer(TrainingArguments(**settings), model or deterministic_tiny_model(), tokenizer,
                         data or demo_data(), [], torch.device("cpu"))


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def surgery_gradients(trainer, steps: list[list[tuple[str, dict]]]) -> dict[str, torch.Tensor]:
    """The gradients gradient surgery leaves for the update after `steps` (one accumulation group), through the
    step loop (PCGrad's draws from random.Random(0)); the update itself is not taken."""
    captured = []
    # the gradient norm the stage's last line reports: none measured, the update not taken
    trainer.loop.optimizer_step = lambda *args, **kwargs: (captured.append(gradients(trainer.model)), (torch.zeros(()), False))[1]
    trainer.loop.run_steps(iter(steps), len(steps), "test", surgery_rng=random.Random(0))
    (combined,) = captured
    return combined


def loss_gradient(model, task, batch, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The gradient of scale * (the task's loss on this batch alone)."""
    model.zero_grad(set_to_none=True)
    (scale * compute_task_loss(model, task, batch)[0]).backward()
    grads = gradients(model)
    model.zero_grad(set_to_none=True)
    return grads


# ---------------------------------------------------------------------------------------------------
# Losses and predictions


@pytest.mark.parametrize("pair_encoder", ["sbert", "cross"])
def test_compute_task_loss_is_the_objective_of_the_forward(tokenizer, pair_encoder):
    model = tiny_model(pair_encoder=pair_encoder).eval()
    cross = pair_encoder == "cross"
    batches = {"sst": sentence_batch(tokenizer, 4), "qqp": pair_batch(tokenizer, "qqp", 4, cross),
               "sts": pair_batch(tokenizer, "sts", 4, cross)}
    with torch.no_grad():
        for task, batch in batches.items():
            expected = model.objectives[task].loss(model(task, batch), batch["labels"])
            assert compute_task_loss(model, task, batch)[0].item() == pytest.approx(expected.item(), rel=1e-6), task


def test_predict_examples_answers_in_the_examples_order(tokenizer):
    model = tiny_model()
    examples = demo_examples("sst", "dev", 9)
    ids, predictions = predict_examples(model, "sst", examples, tokenizer, torch.device("cpu"), 4, MAX_LENGTH)
    assert ids == [e.id for e in examples] and predictions.shape == (9,)
    with torch.no_grad():
        expected = model("sst", collate_sentences(examples, tokenizer, MAX_LENGTH)).argmax(-1)
    assert predictions.tolist() == expected.tolist()


def test_evaluate_reports_every_metric_under_the_internal_names(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer)
    metrics, predictions = trainer.evaluator.evaluate("dev")
    assert set(metrics) == {"sst_acc", "sst_f1_macro", "sst_f1_weighted", "qqp_acc", "qqp_f1", "qqp_f1_weighted",
                            "sts_pearson", "sts_spearman", "overall"}
    assert set(predictions) == {"sst", "qqp", "sts"}
    ids, predicted, gold = predictions["qqp"]
    assert ids == [e.id for e in demo_examples("qqp", "dev", 8)] and set(predicted) <= {0.0, 1.0}
    assert metrics["qqp_acc"] == pytest.approx(float(np.mean(predicted == gold)))


# ---------------------------------------------------------------------------------------------------
# Gradient surgery inside the trainer


def test_pcgrad_step_leaves_each_head_exactly_its_own_task_gradient(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, schedule="round_robin", gradient_surgery="pcgrad")
    model = trainer.model
    batches = {"sst": sentence_batch(tokenizer, 6), "qqp": pair_batch(tokenizer, "qqp", 6),
               "sts": pair_batch(tokenizer, "sts", 6)}
    own = {task: loss_gradient(model, task, batch) for task, batch in batches.items()}  # each task alone

    combined = surgery_gradients(trainer, [list(batches.items())])
    for name in ("sentiment_head.weight", "sentiment_head.bias"):
        assert torch.equal(combined[name], own["sst"][name]), name
    for name in ("paraphrase_head.weight", "paraphrase_head.bias"):
        assert torch.equal(combined[name], own["qqp"][name]), name

    # The shared encoder gets PCGrad's combination, which here really projects: two tasks conflict on it.
    names = [name for name, _ in model.named_parameters()]
    task_gradients = [[own[t].get(n, torch.zeros_like(p)) for n, p in model.named_parameters()] for t in batches]
    shared = [model.is_shared(n) for n in names]
    dots = [sum((task_gradients[i][k] * task_gradients[j][k]).sum() for k in range(len(names)) if shared[k])
            for i, j in ((0, 1), (0, 2), (1, 2))]
    assert min(dots) < 0
    expected = pcgrad_combine(task_gradients, shared, random.Random(0))
    for name, gradient in zip(names, expected):
        if model.is_shared(name):
            torch.testing.assert_close(combined[name], gradient, rtol=1e-5, atol=1e-8)
    # Projecting the heads too (PCGrad on every parameter) would have changed the SST head's gradient.
    everything = pcgrad_combine(task_gradients, [True] * len(names), random.Random(0))
    assert not torch.equal(everything[names.index("sentiment_head.weight")], own["sst"]["sentiment_head.weight"])


def test_cagrad_step_leaves_heads_their_own_gradient_and_combines_the_encoder_by_cagrad(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, schedule="annealed", gradient_surgery="cagrad", cagrad_c=0.4)
    model = trainer.model
    # Annealed groups may repeat a task: its batches add up into that task's one gradient.
    batches = [("qqp", pair_batch(tokenizer, "qqp", 4)), ("sst", sentence_batch(tokenizer, 4)),
               ("qqp", pair_batch(tokenizer, "qqp", 6))]
    own = {"sst": loss_gradient(model, "sst", batches[1][1])}
    first, second = loss_gradient(model, "qqp", batches[0][1]), loss_gradient(model, "qqp", batches[2][1])
    own["qqp"] = {name: first[name] + second[name] for name in first}
    combined = surgery_gradients(trainer, [tasks_together(batches)])
    torch.testing.assert_close(combined["sentiment_head.weight"], own["sst"]["sentiment_head.weight"])
    torch.testing.assert_close(combined["paraphrase_head.weight"], own["qqp"]["paraphrase_head.weight"])
    names = [name for name, _ in model.named_parameters()]
    task_gradients = [[own[t].get(n, torch.zeros_like(p)) for n, p in model.named_parameters()] for t in ("qqp", "sst")]
    expected = cagrad_combine(task_gradients, [model.is_shared(n) for n in names], 0.4)
    for name, gradient in zip(names, expected):
        if model.is_shared(name):
            torch.testing.assert_close(combined[name], gradient, rtol=1e-4, atol=1e-7)


def test_surgery_step_adds_to_gradients_accumulated_before(tmp_path, tokenizer):
    """Two surgery steps in one accumulation group: each halved, their sum is one step's whole gradient."""
    batches = [("sst", sentence_batch(tokenizer, 4)), ("qqp", pair_batch(tokenizer, "qqp", 4)),
               ("sts", pair_batch(tokenizer, "sts", 4))]
    once = surgery_gradients(make_trainer(tmp_path / "once", tokenizer, schedule="round_robin",
                                          gradient_surgery="pcgrad"), [batches])
    twice = surgery_gradients(make_trainer(tmp_path / "twice", tokenizer, schedule="round_robin",
                                           gradient_surgery="pcgrad", grad_accumulation_steps=2), [batches, batches])
    for name in once:
        torch.testing.assert_close(twice[name], once[name])


# ---------------------------------------------------------------------------------------------------
# Gradient accumulation


def test_the_last_short_accumulation_group_is_divided_by_its_own_size(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer, grad_accumulation_steps=2)
    model = trainer.model
    batches = [collate_sentences(demo_examples("sst", "train", 12)[i:i + 4], tokenizer, MAX_LENGTH)
               for i in (0, 4, 8)]
    captured = []

    def capture_instead_of_stepping(gradients_reduced=False, measure_norm=False):  # the weights stay put, so every gradient below is at the same point
        captured.append(gradients(model))
        trainer.optimizer.zero_grad(set_to_none=True)
        return torch.zeros(()), False  # the gradient norm steps.jsonl's line at the stage's end reports; not stepped
    monkeypatch.setattr(trainer.loop, "optimizer_step", capture_instead_of_stepping)
    trainer.loop.run_steps(([("sst", b)] for b in batches), 3, "test")

    assert len(captured) == 2  # groups [1, 2] and [3]
    g1, g2, g3 = (loss_gradient(model, "sst", b) for b in batches)
    for name in g3:
        torch.testing.assert_close(captured[0][name], (g1[name] + g2[name]) / 2, rtol=1e-5, atol=1e-7)
        assert torch.equal(captured[1][name], g3[name]), name  # divided by 1, not by 2


def test_accumulation_takes_one_update_per_group(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, grad_accumulation_steps=3)
    batches = [sentence_batch(tokenizer, 2) for _ in range(7)]
    trainer.loop.run_steps(([("sst", b)] for b in batches), 7, "test")
    assert trainer.state.updates == 3  # 3 + 3 + 1


# ---------------------------------------------------------------------------------------------------
# The learning rate and SMART's momentum across a run


def record_learning_rates(trainer, monkeypatch) -> list[list[float]]:
    rates = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        rates.append([float(group["lr"]) for group in trainer.optimizer.param_groups])
        return step(*args, **kwargs)
    monkeypatch.setattr(trainer.optimizer, "step", recording_step)
    return rates


@pytest.mark.parametrize("accumulation, updates", [(1, 8), (3, 4)])
def test_linear_schedule_sets_each_update_learning_rate(tmp_path, tokenizer, monkeypatch, accumulation, updates):
    # Two stages of 16 SST examples in batches of 4: 4 batches each; with accumulation 3, 2 updates each.
    trainer = make_trainer(tmp_path, tokenizer, lr_schedule="linear", warmup_ratio=0.25,
                           grad_accumulation_steps=accumulation)
    rates = record_learning_rates(trainer, monkeypatch)
    trainer.train([Stage(StageKind.TASK, "sst"), Stage(StageKind.TASK, "sst")])
    total = 2 * math.ceil(4 / accumulation)
    assert trainer.state.total_updates == total and trainer.state.updates == total
    expected = [1e-3 * learning_rate_factor(u, total, "linear", 0.25) for u in range(total)]
    assert [r[0] for r in rates] == pytest.approx(expected, rel=1e-12)
    assert all(len(set(r)) == 1 for r in rates)  # every parameter group
    assert len(set(expected)) > 1 and updates == total


def test_constant_schedule_keeps_the_stage_learning_rate(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer)
    rates = record_learning_rates(trainer, monkeypatch)
    trainer.state.total_updates = 5
    trainer.loop.run_steps(([("sst", sentence_batch(tokenizer, 2))] for _ in range(3)), 3, "test")
    assert rates == [[1e-3] * len(trainer.optimizer.param_groups)] * 3
    assert all(group["lr"] == 1e-3 for group in trainer.optimizer.param_groups)


def record_anchor_momentum(trainer, monkeypatch) -> list[float]:
    momenta = []
    update = trainer.penalty("smart").anchor.update

    def recording_update(model):
        momenta.append(trainer.penalty("smart").anchor.momentum)
        return update(model)
    monkeypatch.setattr(trainer.penalty("smart").anchor, "update", recording_update)
    return momenta


def test_smart_anchor_momentum_is_099_for_the_first_tenth_of_the_run_then_0999(tmp_path, tokenizer, monkeypatch):
    # Two stages of 40 SST examples in batches of 4: 20 updates, the first 2 (10%) at 0.99.
    trainer = make_trainer(tmp_path, tokenizer, data=demo_data(train=40, dev=4, test=2), smart=True,
                           smart_tasks="sst")
    momenta = record_anchor_momentum(trainer, monkeypatch)
    trainer.train([Stage(StageKind.TASK, "sst"), Stage(StageKind.TASK, "sst")])
    assert trainer.state.total_updates == 20
    assert momenta == [0.99] * 2 + [0.999] * 18


def test_a_fixed_smart_momentum_holds_for_the_whole_run(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer, data=demo_data(train=12, dev=4, test=2), smart=True,
                           smart_tasks="sst", smart_momentum=0.5)
    assert trainer.penalty("smart").anchor.momentum == 0.5
    momenta = record_anchor_momentum(trainer, monkeypatch)
    trainer.train([Stage(StageKind.TASK, "sst")])
    assert momenta == [0.5] * 3


# ---------------------------------------------------------------------------------------------------
# The model kept as best, and the training state


def test_the_kept_model_comes_back_without_a_reload_or_another_dev_pass(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer)
    scores = iter([1.0, 0.0])  # the first stage is kept, the second is worse
    monkeypatch.setattr("minbert.training.trainer.kept_model_score", lambda record, tasks: next(scores))
    trainer.train([Stage(StageKind.TASK, "sst"), Stage(StageKind.TASK, "sst")])
    kept_record = trainer.state.history[1]
    live_parameters = [id(p) for p in trainer.model.parameters()]
    saved, _ = read_checkpoint(tmp_path / "run" / "best")
    assert not all(torch.equal(v, saved[k]) for k, v in trainer.model.state_dict().items())  # stage 2's weights

    def no_evaluation(*args, **kwargs):
        raise AssertionError("the kept model's dev evaluation is reused, not run again")
    monkeypatch.setattr(trainer.evaluator, "evaluate_with_scores", no_evaluation)
    metrics, predictions, _ = trainer.use_kept_model()
    assert all(torch.equal(v, saved[k]) for k, v in trainer.model.state_dict().items())
    assert [id(p) for p in trainer.model.parameters()] == live_parameters  # the optimizer's parameters still
    assert metrics == {k: v for k, v in kept_record.items() if k not in ("stage", "index", "train_loss", "seconds",
                                                                        "eval_seconds")}
    monkeypatch.undo()
    again, predictions_again, _ = trainer.evaluator.evaluate_with_scores("dev")
    assert again == metrics
    assert all(np.array_equal(predictions[t][1], predictions_again[t][1]) for t in predictions)


def test_a_stage_records_its_training_seconds_without_the_dev_evaluation(tmp_path, tokenizer, monkeypatch):
    """history's "seconds" is train time (RESULTS.md's train-time columns); the pretrained row's is its dev pass."""
    clock = {"now": 0.0}
    monkeypatch.setattr("minbert.training.trainer.time.time", lambda: clock["now"])
    trainer = make_trainer(tmp_path, tokenizer)
    train_stage, evaluate = trainer.run_stage, trainer.evaluator.evaluate_with_scores

    def slow(function, seconds):
        def run(*args, **kwargs):
            clock["now"] += seconds
            return function(*args, **kwargs)
        return run
    monkeypatch.setattr(trainer, "run_stage", slow(train_stage, 3.0))
    monkeypatch.setattr(trainer.evaluator, "evaluate_with_scores", slow(evaluate, 100.0))
    trainer.train([Stage(StageKind.TASK, "sst")])
    assert [record["seconds"] for record in trainer.state.history] == [100.0, 3.0]


def test_a_resumed_run_without_its_kept_model_in_memory_reads_best_from_disk(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer)
    trainer.train([Stage(StageKind.TASK, "sst")])
    expected = trainer.use_kept_model()[0]
    trainer.kept = None  # as after --resume past the best stage
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)
    assert trainer.use_kept_model()[0] == expected


def scored_dev_ids(trainer, monkeypatch) -> list[dict[str, list[str]]]:
    """Each dev evaluation's ids per task, as the predictor scored them, one dict per evaluation."""
    calls, predict = [], trainer.predictor.predict

    def recording(task, examples, scores=False):
        if task == "sst" or not calls:
            calls.append({})
        ids, values = predict(task, examples, scores)
        calls[-1][task] = list(ids)
        return ids, values
    monkeypatch.setattr(trainer.predictor, "predict", recording)
    return calls


def test_capped_dev_scoring_reads_one_fixed_subset_every_stage_and_says_so(tmp_path, tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, tokenizer, max_eval_examples=3)
    calls = scored_dev_ids(trainer, monkeypatch)
    trainer.train([Stage(StageKind.TASK, "sst"), Stage(StageKind.TASK, "qqp")])
    assert len(calls) == 3  # the pretrained model's and each stage's
    assert all(len(ids) == 3 for call in calls for ids in call.values())
    assert calls[0] == calls[1] == calls[2]
    assert [record["dev_subset"] for record in trainer.state.history] == [3, 3, 3]


def test_a_capped_run_scores_its_kept_model_on_every_dev_example_and_best_json_says_so(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, max_eval_examples=3)
    trainer.train([Stage(StageKind.TASK, "sst")])
    metrics, predictions, scores = trainer.use_kept_model()
    assert all(len(predictions[task][0]) == len(scores[task][0]) == 8 for task in predictions)
    _, saved = read_checkpoint(tmp_path / "run" / "best")
    assert "dev_subset" not in saved["metrics"]
    assert saved["metrics"]["stage"] == "sst" and {k: saved["metrics"][k] for k in metrics} == metrics
    assert metrics == trainer.evaluator.evaluate("dev")[0]
    trainer.kept = None  # as after --resume past the best stage
    assert trainer.use_kept_model()[0] == metrics


def test_a_cap_above_every_dev_set_changes_no_prediction_nor_metric(tmp_path, tokenizer):
    outcomes = []
    for name, cap in (("all", {}), ("capped", {"max_eval_examples": 100})):
        trainer = make_trainer(tmp_path / name, tokenizer, **cap)
        trainer.train([Stage(StageKind.TASK, "sst"), Stage(StageKind.TASK, "sts")])
        history = [{k: v for k, v in r.items() if k not in ("seconds", "eval_seconds", "dev_subset")}
                   for r in trainer.state.history]
        outcomes.append((history, trainer.use_kept_model()))
    (history, (metrics, predictions, scores)), (capped_history, (capped_metrics, capped_predictions, capped_scores)) \
        = outcomes
    assert history == capped_history and metrics == capped_metrics
    for task in predictions:
        assert predictions[task][0] == capped_predictions[task][0]
        assert np.array_equal(scores[task][1], capped_scores[task][1])


def test_state_dict_round_trip_restores_the_state_and_weights(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, smart=True, smart_tasks="sst")
    trainer.train([Stage(StageKind.TASK, "sst")])
    tensors, metadata = trainer.state_dict()
    fresh = make_trainer(tmp_path, tokenizer, smart=True, smart_tasks="sst")
    fresh.load_state_dict(tensors, metadata)
    assert fresh.state == trainer.state
    assert all(torch.equal(p, q) for p, q in zip(fresh.model.parameters(), trainer.model.parameters()))
    assert all(torch.equal(fresh.penalty("smart").anchor.params[n], t)
               for n, t in trainer.penalty("smart").anchor.params.items())


# ---------------------------------------------------------------------------------------------------
# Loaders that run out


def ids_of(batches) -> list[list[str]]:
    return [batch["ids"] for batch in batches]


def test_restarting_loaders_start_over_in_a_new_order(tokenizer):
    examples = demo_examples("sst", "train", 24)

    def loader():
        return make_dataloader(examples, tokenizer, 4, shuffle=True, seed=5, max_length=MAX_LENGTH)
    first_order = ids_of(loader())
    batches = RestartingLoaders({"sst": loader()})
    first = ids_of(batches.next("sst") for _ in range(6))
    second = ids_of(batches.next("sst") for _ in range(6))
    third = ids_of(batches.next("sst") for _ in range(6))
    assert first == first_order  # the first pass is the loader's own order
    assert second != first and third not in (first, second)
    for order in (second, third):  # every later pass is a whole epoch again
        assert sorted(i for batch in order for i in batch) == sorted(e.id for e in examples)
    assert batches.restarts == {"sst": 2}
    again = loader()
    again.batch_sampler.set_epoch(1)
    assert second == ids_of(again)  # a restart is the next epoch of the same seeded sampler: reproducible


def test_restarting_loaders_count_restarts_per_task(tokenizer):
    loaders = {"sst": make_dataloader(demo_examples("sst", "train", 8), tokenizer, 4, shuffle=True),
               "sts": make_dataloader(demo_examples("sts", "train", 12), tokenizer, 4, shuffle=True)}
    batches = RestartingLoaders(loaders)
    for _ in range(5):
        batches.next("sst")
        batches.next("sts")
    assert batches.restarts == {"sst": 2, "sts": 1}


# ---------------------------------------------------------------------------------------------------
# The optimizer's parameter groups


@pytest.mark.parametrize("option", ["finetune", "pretrain"])
def test_trainer_decays_matrices_only_and_skips_frozen_parameters(tmp_path, tokenizer, option):
    model = tiny_model()
    if option == "pretrain":
        for parameter in model.bert.parameters():
            parameter.requires_grad = False
    trainer = make_trainer(tmp_path, tokenizer, model=model, option=option, weight_decay=0.01)
    by_decay = {group["weight_decay"]: {id(p) for p in group["params"]} for group in trainer.optimizer.param_groups}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert by_decay == {0.01: {id(p) for _, p in trainable if p.dim() >= 2},
                        0.0: {id(p) for _, p in trainable if p.dim() == 1}}
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay = {names[i] for i in by_decay[0.0]}
    assert "sentiment_head.bias" in no_decay and "sentiment_head.weight" not in no_decay
    if option == "finetune":
        assert "bert.embeddings.layer_norm.weight" in no_decay
        assert names[id(model.bert.embeddings.word_embeddings.weight)] not in no_decay


# ---------------------------------------------------------------------------------------------------
# fp16: the gradient scaler


def scaled_backward(trainer, tokenizer):
    batch = sentence_batch(tokenizer, 4)
    trainer.parts.scaler.scale(compute_task_loss(trainer.model, "sst", batch)[0]).backward()


def test_an_fp16_step_with_inf_gradients_moves_nothing(tmp_path, tokenizer):
    """A skipped step (inf / NaN gradients) leaves weights, anchor, optimizer state and the schedules' position
    alone, and halves the scale; the next finite step updates all of them. Both go through the step loop."""
    trainer = make_trainer(tmp_path, tokenizer, precision="fp16", smart=True)
    batch = sentence_batch(tokenizer, 4)
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    anchor = {n: t.clone() for n, t in trainer.penalty("smart").anchor.params.items()}
    scale = trainer.parts.scaler.get_scale()
    poisoned = next(p for p in trainer.model.parameters() if p.requires_grad)
    hook = poisoned.register_hook(lambda grad: torch.full_like(grad, math.inf))
    trainer.loop.run_steps([[("sst", batch)]], 1, "test")
    hook.remove()
    assert (trainer.state.updates, trainer.state.skipped_updates, trainer.parts.scaler.get_scale()) == (0, 1, scale / 2)
    assert all(torch.equal(p, weights[n]) for n, p in trainer.model.named_parameters())
    assert all(torch.equal(t, anchor[n]) for n, t in trainer.penalty("smart").anchor.params.items())
    assert not trainer.optimizer.state
    trainer.loop.run_steps([[("sst", batch)]], 1, "test")
    assert (trainer.state.updates, trainer.state.skipped_updates) == (1, 1)
    assert not all(torch.equal(t, anchor[n]) for n, t in trainer.penalty("smart").anchor.params.items())


def test_fp16_gradients_are_unscaled_before_clipping(tmp_path, tokenizer, monkeypatch):
    """Clipping sees the true gradient norm, not the norm times the loss scale (65536)."""
    true = make_trainer(tmp_path / "fp32", tokenizer, max_grad_norm=1.0)
    scaled_backward(true, tokenizer)
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in true.model.parameters()
                                                     if p.grad is not None])).item()
    trainer = make_trainer(tmp_path / "fp16", tokenizer, max_grad_norm=1.0, precision="fp16")
    with torch.autocast("cpu", enabled=False):  # the same float32 gradients, scaled
        scaled_backward(trainer, tokenizer)
    norms = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: norms.append(clip(params, max_norm)))
    trainer.loop.optimizer_step()
    assert trainer.parts.scaler.get_scale() == 65536.0 and norms[0].item() == pytest.approx(expected, rel=1e-5)
