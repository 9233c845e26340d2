"""SQuAD as MultitaskBERT's fourth task: the span head, its loss and SMART divergence, per-task adapters, the
checkpoint, and the trainer's predictions, on a tiny random BERT and hand-written questions."""
import numpy as np
import pytest
import torch

from conftest import deterministic_tiny_model, pair_batch, sentence_batch, tiny_model
from minbert.model.adapters import AdapterConfig
from minbert.model.multitask_bert import MultitaskBERT, freeze_encoder, load_multitask_model, save_multitask_model
from minbert.prediction.inference import predict_answers
from minbert.tasks import MULTITASK, RUN_TASKS
from minbert.tasks.qa import PADDING_LOGIT
from minbert.tasks.squad import QAExample, QAWindows
from minbert.training.objective import compute_task_loss
from minbert.training.penalties.smart import SmartPenalty
from smart import SmartConfig, SmartRegularizer

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = ("The lighthouse of Varnholm was built in 1871 by the engineer Ada Lindqvist. It stands on a granite "
           "cliff north of the harbour and its lamp can be seen from twenty kilometres away.")
QUESTIONS = [
    QAExample("q1", "Who built the lighthouse?", CONTEXT, (("Ada Lindqvist", CONTEXT.index("Ada")),), False),
    QAExample("q2", "When was the lighthouse built?", CONTEXT, (("1871", CONTEXT.index("1871")),), False),
    QAExample("q3", "Who painted the harbour?", CONTEXT, (), True),
]


def qa_batch(tokenizer, max_length: int = 32, doc_stride: int = 8) -> dict:
    windows = QAWindows.build(QUESTIONS, tokenizer, max_length, doc_stride)
    return windows.collate(range(len(windows)))


def test_the_three_task_model_has_no_span_head_and_the_four_task_model_keeps_the_others_weights():
    three, four = tiny_model(0), tiny_model(0, tasks=RUN_TASKS)
    assert three.tasks == MULTITASK and not hasattr(three, "span_head")
    assert four.tasks == RUN_TASKS and four.span_head.out_features == 2
    # The span head is built last, so the three tasks' heads are drawn as before (a four-task run's
    # other heads start where a three-task run's do).
    for name, tensor in three.state_dict().items():
        assert torch.equal(tensor, four.state_dict()[name]), name
    qa_only = tiny_model(0, tasks=["qa"])
    assert not hasattr(qa_only, "sentiment_head") and not hasattr(qa_only, "paraphrase_head")
    with pytest.raises(ValueError, match="tasks must be some of"):
        tiny_model(0, tasks=("sst", "mnli"))


def test_span_logits_cover_every_token_and_padding_can_be_neither_start_nor_end(tokenizer):
    model = deterministic_tiny_model(tasks=RUN_TASKS).eval()
    batch = qa_batch(tokenizer)
    logits = model("qa", batch)
    assert logits.shape == (*batch["input_ids"].shape, 2) and logits.dtype == torch.float32
    padding = batch["attention_mask"] == 0
    assert padding.any()
    assert torch.all(logits[padding] == PADDING_LOGIT) and torch.all(logits[~padding] > PADDING_LOGIT)


def test_span_loss_is_the_mean_of_the_start_and_end_cross_entropies(tokenizer):
    model = deterministic_tiny_model(tasks=RUN_TASKS)
    batch = qa_batch(tokenizer)
    logits = model("qa", batch)
    expected = (torch.nn.functional.cross_entropy(logits[..., 0], batch["labels"][:, 0])
                + torch.nn.functional.cross_entropy(logits[..., 1], batch["labels"][:, 1])) / 2
    loss, _ = compute_task_loss(model, "qa", batch)
    assert torch.allclose(loss, expected)
    loss.backward()
    assert model.span_head.weight.grad.abs().sum() > 0


def test_smart_regularises_the_span_head_with_a_finite_positive_penalty(tokenizer):
    model = deterministic_tiny_model(tasks=RUN_TASKS)
    batch = qa_batch(tokenizer)
    plain, _ = compute_task_loss(model, "qa", batch)
    regularizer = SmartRegularizer(model, SmartConfig(epsilon=1e-2, step_size=1e-1, noise_std=1e-2,
                                                      bregman_weight=0.0))
    smart, _ = compute_task_loss(model, "qa", batch, [SmartPenalty({"qa": regularizer})])
    assert torch.isfinite(smart) and smart > plain


def test_a_qa_adapter_cannot_change_the_other_tasks(tokenizer):
    model = deterministic_tiny_model(tasks=RUN_TASKS, adapter=AdapterConfig("lora", rank=2))
    freeze_encoder(model)
    sentences, pairs = sentence_batch(tokenizer, 4), pair_batch(tokenizer, "qqp", 4)
    with torch.no_grad():
        before = model("sst", sentences), model("qqp", pairs)
        qa_before = model("qa", qa_batch(tokenizer)).clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    for _ in range(2):
        optimizer.zero_grad()
        compute_task_loss(model, "qa", qa_batch(tokenizer))[0].backward()
        optimizer.step()
    with torch.no_grad():
        assert torch.equal(model("sst", sentences), before[0]) and torch.equal(model("qqp", pairs), before[1])
        assert not torch.equal(model("qa", qa_batch(tokenizer)), qa_before)  # the QA adapter did train


def test_a_four_task_checkpoint_round_trips(tmp_path, tokenizer):
    model = deterministic_tiny_model(tasks=RUN_TASKS).eval()
    save_multitask_model(model, tmp_path / "four", {})
    loaded = load_multitask_model(tmp_path / "four").eval()
    assert loaded.tasks == RUN_TASKS
    batch = qa_batch(tokenizer)
    with torch.no_grad():
        assert torch.equal(loaded("qa", batch), model("qa", batch))


def test_predicted_answers_are_the_decoding_of_every_windows_logits(tokenizer):
    model = deterministic_tiny_model(tasks=RUN_TASKS)
    windows = QAWindows.build(QUESTIONS, tokenizer, max_length=24, doc_stride=6)  # several windows a question
    assert len(windows) > len(QUESTIONS)
    answers = predict_answers(model, "qa", windows, torch.device("cpu"), batch_size=2, max_answer_tokens=5)
    assert list(answers) == [q.id for q in QUESTIONS]
    for question in QUESTIONS:
        assert answers[question.id].text in question.context and answers[question.id].text.strip()
        assert np.isfinite(answers[question.id].margin)
    # The same answers whatever the batching (padding is masked; kernels may round differently).
    rebatched = predict_answers(model, "qa", windows, torch.device("cpu"), batch_size=5, max_answer_tokens=5)
    assert {q: a.text for q, a in rebatched.items()} == {q: a.text for q, a in answers.items()}
    assert all(rebatched[q].margin == pytest.approx(answers[q].margin, abs=1e-4) for q in answers)
