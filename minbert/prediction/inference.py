"""A MultitaskBERT's predictions of whole splits: each task's predictions or the scores they are decided from, and
SQuAD's answers and window logits, batched for evaluation and, under torchrun, shared out over the ranks.

    splits = TokenizedSplits(tokenizer, model, max_length, task_settings)  # data.batches: each split tokenised once
    predictor = Predictor(model, splits, device, PredictionSettings(batch_size, max_length, precision, quiet))
    ids, scores = predictor.predict("sst", examples, scores=True)
    answers = predictor.answer("qa", questions)                        # SQuAD: squad.Answer by question id
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from minbert.data.batches import TokenizedExamples, TokenizedSplits, predict_in_file_order, tokenized_dataloader
from minbert.distributed import SINGLE_PROCESS, Distributed
from minbert.model.multitask_bert import MultitaskBERT
from minbert.runtime import autocast, pad_to_multiple_of, to_device
from minbert.tasks import TASKS
from minbert.tasks.squad import Answer, QAExample, QAWindows, decode_answers


def scored_batches(model: MultitaskBERT, task: str, shard: TokenizedExamples | QAWindows, device: torch.device,
                   batch_size: int, precision: str, quiet: bool) -> Iterator[tuple[list[str], np.ndarray]]:
    """Each batch's ids and the model's scores of it (float32 on the host), in the order the loader visits them;
    the callers run under torch.inference_mode."""
    loader = tokenized_dataloader(shard, batch_size, shuffle=False, pin_memory=device.type == "cuda",
                                  pad_to_multiple_of=pad_to_multiple_of(device))
    for batch in tqdm(loader, desc=f"predict {task}", leave=False, disable=quiet):
        batch = to_device(batch, device)
        with autocast(device, precision):
            values = model.score(task, batch).float().cpu().numpy()
        yield batch["ids"], values


@torch.inference_mode()
def predict_examples(model: MultitaskBERT, task: str, examples: list | TokenizedExamples, tokenizer,
                     device: torch.device, batch_size: int, max_length: int, precision: str = "fp32",
                     quiet: bool = True, distributed: Distributed = SINGLE_PROCESS,
                     scores: bool = False) -> tuple[list[str], np.ndarray]:
    """The model's prediction for every example (SST class, QQP 0/1, STS 0-5), ids in the examples' order;
    with `scores` the score each prediction is decided from instead (losses.py: SST's 5 logits, QQP's logit).
    `precision`: a resolved one (runtime.resolve_precision), bf16 / fp16 autocast or fp32.
    Under torchrun each rank predicts every world_size-th example and all ranks get all predictions.
    `examples` may be tokenised already (Predictor.predict's cache), with max_length and the task's pair encoding."""
    model.eval()
    cross_encoder = model.reads_pairs_jointly(task)
    if not isinstance(examples, TokenizedExamples):
        examples = TokenizedExamples.tokenize(examples, tokenizer, max_length, cross_encoder)
    elif (examples.max_length, examples.cross_encoder) != (max_length, cross_encoder):
        raise ValueError(f"{task} examples tokenised with max_length {examples.max_length} and cross_encoder "
                         f"{examples.cross_encoder}, but predicting needs {max_length} and {cross_encoder}")

    def predict_shard(shard: TokenizedExamples) -> tuple[list[str], np.ndarray]:
        ids, outputs = [], []
        for batch_ids, values in scored_batches(model, task, shard, device, batch_size, precision, quiet):
            outputs.append(values)
            ids += batch_ids
        return ids, np.concatenate(outputs)
    ids, values = predict_in_file_order(examples, predict_shard, distributed)
    return ids, values if scores else decide(model, task, values)


@torch.inference_mode()
def predict_span_logits(model: MultitaskBERT, task: str, windows: QAWindows, device: torch.device, batch_size: int,
                        precision: str = "fp32", quiet: bool = True,
                        distributed: Distributed = SINGLE_PROCESS) -> tuple[list[str], np.ndarray]:
    """The start and end logits of every window of an extractive task (SQuAD), (window ids, (N, max_length, 2)) in
    the windows' order, zero beyond each window's tokens; under torchrun each rank reads every world_size-th window
    and all ranks get every window's."""
    model.eval()

    def predict_shard(shard: QAWindows) -> tuple[list[str], np.ndarray]:
        ids, logits = [], []
        for batch_ids, values in scored_batches(model, task, shard, device, batch_size, precision, quiet):
            # (B, T, 2) padded to (B, max_length, 2): batches are as long as their longest window
            logits.append(np.pad(values, ((0, 0), (0, windows.max_length - values.shape[1]), (0, 0))))
            ids += batch_ids
        return ids, np.concatenate(logits)  # (B, max_length, 2)
    return predict_in_file_order(windows, predict_shard, distributed)


@torch.inference_mode()
def predict_answers(model: MultitaskBERT, task: str, windows: QAWindows, device: torch.device, batch_size: int,
                    precision: str = "fp32", quiet: bool = True, distributed: Distributed = SINGLE_PROCESS,
                    n_best: int = 20, max_answer_tokens: int = 30) -> dict[str, Answer]:
    """Every SQuAD question's best span and no-answer margin (squad.decode_answers) from the logits of all
    of its windows (predict_span_logits)."""
    _, logits = predict_span_logits(model, task, windows, device, batch_size, precision, quiet, distributed)
    return decode_answers(windows, logits, n_best, max_answer_tokens)


def decide(model: MultitaskBERT, task: str, scores: np.ndarray) -> np.ndarray:
    """The predictions of saved scores (losses.py's decide): SST classes, QQP 0/1, STS scores as they are."""
    return model.objectives[task].decide(torch.from_numpy(scores)).numpy()


@dataclass(frozen=True)
class PredictionSettings:
    """How a run predicts: its evaluation batch size, its max_length, its resolved precision
    (runtime.resolve_precision) and whether progress bars are off."""
    batch_size: int
    max_length: int
    precision: str
    quiet: bool


class Predictor:
    """The model's predictions of whole splits, from the run's TokenizedSplits: what evaluation, the leaderboard
    files and --score_train read."""

    def __init__(self, model: MultitaskBERT, splits: TokenizedSplits, device: torch.device,
                 settings: PredictionSettings, distributed: Distributed = SINGLE_PROCESS):
        self.model, self.splits, self.device, self.settings = model, splits, device, settings
        self.distributed = distributed

    def predict(self, task: str, examples, scores: bool = False) -> tuple[list[str], np.ndarray]:
        """predict_examples of the split: (ids, predictions), or with `scores` the scores they are decided from."""
        settings = self.settings
        return predict_examples(self.model, task, self.splits.get(task, examples), self.splits.tokenizer,
                                self.device, settings.batch_size, settings.max_length, settings.precision,
                                settings.quiet, self.distributed, scores)

    def answer(self, task: str, questions: list[QAExample]) -> dict[str, Answer]:
        """An extractive task's (SQuAD's) questions' best spans and no-answer margins (predict_answers)."""
        settings, qa = self.settings, TASKS[task].windowing(self.splits.task_settings)
        return predict_answers(self.model, task, self.splits.get(task, questions), self.device, settings.batch_size,
                               settings.precision, settings.quiet, self.distributed, qa.n_best, qa.max_answer_tokens)

    def span_logits(self, task: str, questions: list[QAExample]) -> tuple[list[str], list[np.ndarray]]:
        """The window ids of an extractive task's (SQuAD's) questions and each window's (length, 2) start and end
        logits (predict_span_logits): what --score_train saves for --distill."""
        windows = self.splits.get(task, questions)
        ids, logits = predict_span_logits(self.model, task, windows, self.device, self.settings.batch_size,
                                          self.settings.precision, self.settings.quiet, self.distributed)
        return ids, [row[:length] for row, length in zip(logits, windows.lengths)]
