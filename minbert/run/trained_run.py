"""A trained run in Python: its kept model predicting text as predict.py does, and encoding sentences as
sentence-transformers' encode does (docs/python_api.md).

    from minbert import load_run
    run = load_run("runs/demo")                                   # its kept model (runs/demo/best), or a checkpoint
    run.predict(["A gripping film."], task="sst").label_names     # ['somewhat positive']
    run.predict([("How do I learn Python?", "What is the best way to learn Python?")], task="qqp", threshold=True)
    run.encode(["A gripping film.", "A dull film."])              # (2, hidden) numpy array, the run's pooling

predict() gives a Predictions (minbert/prediction/new_inputs.py): labels, label_names, probabilities, scores, and
records(), predict.py's JSON lines. calibrated=True divides the logits by the temperature fitted on the run's dev set
before the probabilities, threshold=True decides QQP at the threshold chosen there (docs/calibration.md): both read
the run's calibration.json, fitted on its kept model.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from minbert.model.multitask_bert import MultitaskBERT, load_multitask_checkpoint
from minbert.prediction.inference import Predictor
from minbert.prediction.new_inputs import Predictions, examples_of_texts, predictions_of
from minbert.reports.embedding_analysis import sentence_embeddings
from minbert.run.kept_model import KEPT_MODEL, checkpoint_prefix, kept_predictor, missing_head
from minbert.run.run_outputs import check_run_dev
from minbert.runtime import resolve_device, use_tf32
from minbert.tasks import TASKS, TEXT_TASKS, task_name
from minbert.tasks.calibration import calibration_path, read_calibration
from minbert.tasks.course_files import SentenceExample
from minbert.tasks.score_files import ScoresFileError

# What the two dev-fitted choices are called where they are asked for: the API's arguments (predict.py names flags).
API_NAMES = ("calibrated=True", "threshold=True")


def dev_fitted(prefix: Path, task: str, calibrated: bool, threshold: bool,
               names: tuple[str, str] = API_NAMES) -> tuple[float, float | None]:
    """The temperature (`calibrated`; else 1) and the decision threshold (`threshold`; else None) fitted on the run's
    dev set, from its calibration.json, read before any model loads; ValueError for a task without them,
    ScoresFileError when the file lacks them, is not the run's own (its accuracies are not those best.json records:
    check_run_dev) or `prefix` is not the kept model they were fitted on. `names`: what the
    two choices are called in the message."""
    asked = [name for name, wanted in zip(names, (calibrated, threshold)) if wanted]
    if not asked:
        return 1.0, None
    if calibrated and not TASKS[task].calibrated:
        raise ValueError(f"{names[0]}: {task} has no temperature")
    if threshold and not TASKS[task].has_threshold:
        raise ValueError(f"{names[1]}: {task} has no decision threshold")
    flags = " and ".join(asked)
    if prefix.name != KEPT_MODEL:
        raise ScoresFileError(f"{flags}: {calibration_path(prefix.parent)} was fitted on the kept model "
                              f"({KEPT_MODEL}), not {prefix.name}")
    tasks = read_calibration(prefix.parent)
    check_run_dev(prefix.parent, {}, tasks)  # fitted on this run's dev scores, not a copy of another run's file
    if task not in tasks:
        raise ScoresFileError(f"{flags}: {calibration_path(prefix.parent)} has no {task} (the run did not "
                              "train it, or its dev set was too small to calibrate)")
    entry = tasks[task]
    return (entry["temperature"] if calibrated else 1.0), (entry["threshold"]["logit"] if threshold else None)


@dataclass
class TrainedRun:
    """A run's kept model (or one checkpoint of it) on `device`, predicting as the run did: its tokenizer,
    --max_length, --eval_batch_size (or `batch_size`) and precision (or `precision`)."""
    prefix: Path
    model: MultitaskBERT
    metadata: dict
    device: torch.device
    batch_size: int | None = None
    precision: str | None = None
    quiet: bool = True

    @cached_property
    def predictor(self) -> Predictor:
        """Made on first use, once a task is known to have a head (what the run recorded is read here)."""
        return kept_predictor(self.model, self.prefix, self.metadata, self.device, self.batch_size, self.precision,
                              self.quiet)

    @property
    def tasks(self) -> list[str]:
        """The tasks it predicts text of (those it has a head for)."""
        return [task for task in TEXT_TASKS if task in self.model.tasks]

    def predict(self, texts: Sequence[str | Sequence[str]], task: str, calibrated: bool = False,
                threshold: bool = False) -> Predictions:
        """`task`'s predictions of `texts`: sentences, or for a pair task pairs of sentences; `task` as the command
        line names it (sst, qqp / quora / para, sts)."""
        task = task_name(task, TEXT_TASKS)
        return self.predict_examples(task, examples_of_texts(TASKS[task], texts), calibrated, threshold)

    def predict_examples(self, task: str, examples: list, calibrated: bool = False, threshold: bool = False,
                         names: tuple[str, str] = API_NAMES) -> Predictions:
        """Predictions of examples already read (predict.py's files: minbert.prediction.new_inputs.read_examples)."""
        temperature, decision_threshold = dev_fitted(self.prefix, task, calibrated, threshold, names)
        problem = missing_head(self.model, self.prefix, task)
        if problem:
            raise problem
        ids, scores = self.predictor.predict(task, examples, scores=True)
        return predictions_of(TASKS[task], ids, scores, temperature, decision_threshold)

    def encode(self, sentences: str | Sequence[str], task: str | None = None,
               normalize_embeddings: bool = False) -> np.ndarray:
        """Sentence embeddings as sentence-transformers' encode gives them: float32 (N, hidden), or (hidden,) for one
        string, each the run's pooling (--pooling: mean or [CLS]) of the encoder's last hidden states, what the
        heads read. `task` picks the task's adapters in a model with per-task ones (ValueError without it there);
        `normalize_embeddings` scales each to unit length, so that a dot product is the cosine."""
        if task is None and self.model.has_task_adapters():
            raise ValueError(f"{self.prefix}: the model has per-task adapters; name the task whose adapters encode "
                             f"(one of {', '.join(self.tasks)})")
        task = self.tasks[0] if task is None else task_name(task, TEXT_TASKS)
        texts = [sentences] if isinstance(sentences, str) else list(sentences)
        examples = [SentenceExample(str(number), text, None) for number, text in enumerate(texts, start=1)]
        settings = self.predictor.settings
        embeddings = sentence_embeddings(self.model, task, examples, self.predictor.splits.tokenizer,
                                         self.predictor.device, settings.batch_size, settings.max_length,
                                         settings.precision)
        if normalize_embeddings:
            embeddings = embeddings / np.maximum(np.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)
        return embeddings[0] if isinstance(sentences, str) else embeddings


def load_run(run: str | Path, device: str | torch.device | None = None, batch_size: int | None = None,
             precision: str | None = None, quiet: bool = True) -> TrainedRun:
    """A run's folder (its kept model) or a checkpoint prefix, loaded on `device` (default: CUDA when there is a
    GPU, else the CPU) to predict as the run did; `batch_size` and `precision` replace the run's --eval_batch_size
    and --precision. CheckpointError when there is no model there."""
    prefix = checkpoint_prefix(run)
    device = resolve_device(torch.cuda.is_available()) if device is None else torch.device(device)
    use_tf32(device)
    model, metadata = load_multitask_checkpoint(prefix, device)
    return TrainedRun(prefix, model, metadata, device, batch_size, precision, quiet)
