"""SQuAD 2.0 extractive question answering (seed 002's fourth task; squad.py reads, windows, decodes and scores it):
a span of the context, or no answer. The official JSON files; a question's long context is read in windows, each
trained to point at the answer's start and end token (or at [CLS]); its answer is decoded over all of its windows,
so it has no per-example decision, CSV or ensemble. Its files in a run's scores/:

    qa-{dev,test}.csv        id,no_answer_margin,answer: no-answer score - best span score, and that span
    qa-train.safetensors     --score_train: every training window's start and end logits (too many numbers for a
                             CSV), what a student distils from
"""
from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save
from torch import Tensor, nn

from minbert.files import atomic_write_bytes, atomic_write_csv
from minbert.tasks.base import Task, TaskData, TaskEvaluation, TaskModel, TaskOption, TaskOutputs
from minbert.tasks.losses import SpanObjective, softened_span_kl
from minbert.tasks.score_files import MAX_LOGIT, ScoresFileError, fingerprint, score_text
from minbert.tasks.squad import (Answer, QAExample, QASettings, QAWindows, best_threshold, check_window_room,
                                 load_squad, predictions, qa_metrics, write_squad_predictions)

PADDING_LOGIT = -1e4  # a span logit of padding: exp() of it is 0 in float32
GROUP = "SQuAD 2.0 question answering (--tasks ...,qa); defaults are those of the BERT repository's run_squad.py"
OPTIONS = (
    TaskOption("qa_max_length", QASettings.max_length, "tokens per window: [CLS] question [SEP] context piece [SEP]",
               GROUP, dict(type=int)),
    TaskOption("qa_doc_stride", QASettings.doc_stride, "tokens each window shares with the one before, when a "
               "context needs several (transformers' stride)", GROUP, dict(type=int)),
    TaskOption("qa_max_answer_tokens", QASettings.max_answer_tokens, "longest answer span, in tokens", GROUP,
               dict(type=int)),
    TaskOption("qa_n_best", QASettings.n_best, "start and end candidates per window", GROUP, dict(type=int)),
)


class SquadData(TaskData):
    """The official JSON files, each question cut into windows."""

    def load(self, path: str | Path, split: str) -> list[QAExample]:
        return load_squad(path, split)

    def tokenize(self, cache, examples: Sequence[QAExample], max_length: int, joint_pairs: bool,
                 settings: Mapping[str, object]):
        """Its questions cut into windows (windowing), once per run."""
        windowing = self.task.windowing(settings)
        return cache.windows(examples, windowing.max_length, windowing.doc_stride)

    def check_inputs(self, data, tokenizer, settings: Mapping[str, object],
                     check_length: Callable[[int, str], None]) -> None:
        """Its windows (--qa_max_length) fit the model's positions, and leave more than --qa_doc_stride context
        tokens beside the longest question of each split: what cutting the windows would find only mid-run."""
        windowing = self.task.windowing(settings)
        check_length(windowing.max_length, "--qa_max_length")
        for split in (data.train, data.dev, data.test):
            if split is not None:
                check_window_room(split, tokenizer, windowing.max_length, windowing.doc_stride)


class SpanModel(TaskModel):
    """A start and an end logit of every token; answers decoded per question over its windows (squad.decode_answers,
    best_threshold, qa_metrics)."""

    @property
    def history_columns(self) -> tuple[tuple[str, str], ...]:
        return ((f"{self.task.name}_f1", f"{self.task.title} F1"),)

    def feature_size(self, pair_encoders: Mapping[str, str], hidden: int) -> None:
        return None  # every token's hidden state, as it is

    def build_head(self, in_features: int) -> nn.Module:
        return nn.Linear(in_features, 2)  # start and end logit of every token (Devlin et al. 2019's span head)

    def outputs(self, model: nn.Module, hidden: Tensor, inputs) -> Tensor:
        logits = self.head(model)(hidden).float()  # (B, T, 2)
        # Padding can be neither start nor end; a finite floor keeps SMART's KL free of 0 * inf.
        return logits.masked_fill(~inputs.attention_mask.bool().unsqueeze(-1), PADDING_LOGIT)

    def objective(self, options: Mapping[str, object]) -> SpanObjective:
        return SpanObjective()

    def distillation_loss(self, objective, outputs: Tensor, teacher, ids: list[str], temperature: float) -> Tensor:
        student = objective.score(outputs)
        return softened_span_kl(student, teacher.of(ids, student), temperature)

    def decide(self, scores: Tensor) -> Tensor:
        raise ValueError(f"{self.task.name!r} has no per-example decision (SQuAD's answers are decoded per question: "
                         "squad.py)")

    def metrics(self, predictions, gold) -> dict[str, float]:
        raise ValueError(f"{self.task.name!r}'s metrics are those of its answers at a no-answer threshold: "
                         "squad.qa_metrics")

    def evaluate(self, predictor, examples: list[QAExample], chosen: Mapping[str, float] | None) -> TaskEvaluation:
        """Its answers' metrics at the no-answer threshold `chosen` on dev, or on a dev evaluation (`chosen` None) at
        the threshold that maximises their F1 (squad.best_threshold), recorded among the metrics."""
        answers = predictor.answer(self.task.name, examples)
        threshold = best_threshold(answers, examples) if chosen is None else self.task.threshold(chosen)
        return TaskEvaluation(qa_metrics(answers, examples, threshold), answers, answers)


class AnswerOutputs(TaskOutputs):
    """Per question, its answers (the official JSON, qa-SPLIT.csv); --score_train: per window, its logits."""
    score_columns = ("no_answer_margin", "answer")

    def format_prediction(self, value) -> str:
        raise ValueError(f"{self.task.name!r} predictions are the official JSON file (squad.write_squad_predictions)")

    def parse_prediction(self, text: str) -> str:
        raise ValueError(f"{self.task.name!r} predictions are the official JSON file (squad.write_squad_predictions)")

    def predict_scores(self, predictor, examples: list[QAExample]) -> dict[str, Answer]:
        return predictor.answer(self.task.name, examples)

    def write_outputs(self, scores: dict[str, Answer], predictions_path: Path, scores_file: Path,
                      chosen: Mapping[str, float]) -> str:
        """The official predictions JSON of the answers at the no-answer threshold chosen on dev, and their
        scores."""
        threshold = self.task.threshold(chosen)
        write_squad_predictions(predictions_path, predictions(scores, threshold))
        write_qa_scores(scores_file, scores)
        return f"{len(scores)} questions, no-answer threshold {threshold:.4f}"

    def train_scores(self, predictor, examples: list[QAExample]) -> tuple[list[str], list[np.ndarray]]:
        return predictor.span_logits(self.task.name, examples)

    def train_scores_file(self, run_dir: str | os.PathLike) -> Path:
        return span_logits_path(run_dir)

    def write_train_scores(self, run_dir: str | os.PathLike, scores, settings: Mapping[str, object]) -> str:
        ids, logits = scores
        path, windowing = span_logits_path(run_dir), self.task.windowing(settings)
        write_span_logits(path, ids, logits, windowing.max_length, windowing.doc_stride)
        return f"{path} ({len(ids)} windows)"

    def load_teacher(self, run_dir: str | os.PathLike, ids: list[str],
                     settings: Mapping[str, object] | None) -> TeacherSpans:
        """The teacher's window logits of the questions `ids`; refused when its windows are cut otherwise than the
        student's (`settings`; None: not checked)."""
        path = span_logits_path(run_dir)
        if not path.is_file():
            raise ScoresFileError(f"{path}: no SQuAD train logits for --distill; write them with --score_train")
        spans = read_span_logits(path)
        student = None if settings is None else self.task.windowing(settings)
        if student is not None and (spans.max_length, spans.doc_stride) != (student.max_length, student.doc_stride):
            raise ScoresFileError(f"{path}: windows of {spans.max_length} tokens with stride {spans.doc_stride}, this "
                                  f"run cuts {student.max_length} with stride {student.doc_stride} (--qa_max_length, "
                                  "--qa_doc_stride)")
        scored = {i.rpartition("#")[0] for i in spans.ids}
        missing = [i for i in ids if i not in scored]
        if missing:
            raise ScoresFileError(f"{path}: no teacher logits for {len(missing)} of the {len(ids)} {self.task.name} "
                                  f"training questions (e.g. id {missing[0]}); the teacher must have scored this "
                                  "training set")
        return TeacherSpans(dict(zip(spans.ids, spans.logits)), path)


@dataclass(frozen=True, kw_only=True, eq=False)
class QuestionAnswering(Task):
    data_part = SquadData
    model_part = SpanModel
    outputs_part = AnswerOutputs

    def windowing(self, settings: Mapping[str, object]) -> QASettings:
        """How its questions are cut into windows and answered, by its options in `settings`."""
        settings = self.own_settings(settings)
        return QASettings(settings["qa_max_length"], settings["qa_doc_stride"], settings["qa_n_best"],
                          settings["qa_max_answer_tokens"])

    def check_settings(self, settings: Mapping[str, object], pair_encoders: Mapping[str, str]) -> None:
        settings = self.own_settings(settings)
        for name, value in settings.items():
            if not value >= 1:
                raise ValueError(f"--{name} must be >= 1, got {value}")
        if settings["qa_doc_stride"] >= settings["qa_max_length"]:
            raise ValueError("--qa_doc_stride must be below --qa_max_length")

    def threshold(self, chosen: Mapping[str, float]) -> float:
        """The no-answer threshold of dev metrics (qa_metrics' qa_threshold); 0 before any dev evaluation chose one:
        answer where the best span scores above no answer."""
        return chosen.get(f"{self.name}_threshold", 0.0)


TASK = QuestionAnswering(name="qa", order=4, trainable=True, aliases=("squad",), title="SQuAD", file_prefix="squad",
                         flag_prefix="squad", file_names=("train-v2.0.json", "dev-v2.0.json", "test-v2.0.json"),
                         output_extension="json", label_column="answers", text_columns=(), leaderboard_column="answer",
                         head_name="span_head", softens=True, test_file_optional=True, options=OPTIONS)


def write_qa_scores(path: str | os.PathLike, answers: dict[str, Answer]) -> None:
    """Its dev and test scores: per question (in the order given) the no-answer margin, what a threshold or an
    ensemble decides answerability from, and the best non-empty span it would otherwise answer."""
    atomic_write_csv(path, [["id", *TASK.outputs.score_columns],
                            *([qid, score_text(answer.margin), answer.text] for qid, answer in answers.items())])


# -- its train scores: the start and end logits of every window ------------------------------------------

def span_logits_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "scores" / f"{TASK.name}-train.safetensors"


def write_span_logits(path: str | os.PathLike, ids: Sequence[str], logits: Sequence[np.ndarray], max_length: int,
                      doc_stride: int) -> None:
    """SQuAD windows' start and end logits, window `ids[i]`'s as `logits[i]` (its own length L_i, (L_i, 2)), in
    safetensors: "logits" (sum L_i, 2) float32 and "lengths" (N,) int64, the window ids and the windowing
    (max_length, doc_stride) as JSON in its metadata "windows". Atomic, as every write of the project."""
    lengths = np.array([len(row) for row in logits], dtype=np.int64)
    flat = np.concatenate([np.asarray(row, dtype=np.float32).reshape(-1, 2) for row in logits])  # (sum L_i, 2)
    # One metadata key: safetensors writes several in no fixed order, and the file must be byte-reproducible.
    windows = json.dumps({"ids": list(ids), "max_length": max_length, "doc_stride": doc_stride})
    atomic_write_bytes(path, save({"logits": flat, "lengths": lengths}, metadata={"windows": windows}))


@dataclass(frozen=True)
class SpanLogits:
    """A qa-train.safetensors file: window ids and each window's (length, 2) logits."""
    ids: list[str]
    logits: list[np.ndarray]  # N arrays (L_i, 2)
    max_length: int
    doc_stride: int


def read_span_logits(path: str | os.PathLike) -> SpanLogits:
    """write_span_logits' file, checked (tensors, lengths, ids, finite values); nothing is unpickled. Raises
    ScoresFileError naming the file."""
    path = Path(path)
    try:
        with safe_open(path, framework="np") as handle:
            windows = json.loads((handle.metadata() or {})["windows"])
            flat, lengths = handle.get_tensor("logits"), handle.get_tensor("lengths")
        ids, max_length, doc_stride = windows["ids"], int(windows["max_length"]), int(windows["doc_stride"])
    except FileNotFoundError:
        raise ScoresFileError(f"{path}: no such scores file (a run writes it with --score_train)") from None
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as err:
        raise ScoresFileError(f"{path}: not a SQuAD train-logits file ({type(err).__name__}: {err})") from None
    if lengths.dtype.kind not in "iu":  # window lengths count tokens: a float would split the logits anywhere
        raise ScoresFileError(f"{path}: the window lengths must be integers, found {lengths.dtype}")
    if (flat.ndim != 2 or flat.shape[1] != 2 or lengths.ndim != 1 or not isinstance(ids, list)
            or not all(isinstance(i, str) for i in ids) or len(lengths) != len(ids) or (lengths < 1).any()
            or int(lengths.sum()) != len(flat)):
        raise ScoresFileError(f"{path}: the logits, lengths and window ids do not fit together")
    if not np.isfinite(flat).all():
        raise ScoresFileError(f"{path}: a logit that is not finite")
    if (np.abs(flat) > MAX_LOGIT).any():
        raise ScoresFileError(f"{path}: a logit beyond +-{MAX_LOGIT:g} ({flat.flat[np.abs(flat).argmax()]:g}), which "
                              "no trained model gives")
    if len(set(ids)) != len(ids):
        raise ScoresFileError(f"{path}: repeated window id {next(i for i, c in Counter(ids).items() if c > 1)!r}")
    return SpanLogits(ids, np.split(flat, np.cumsum(lengths)[:-1]), max_length, doc_stride)


@dataclass(frozen=True)
class TeacherSpans:
    """The teacher's logits of each training window (its own length, (L, 2)), by window id."""
    logits: dict[str, np.ndarray]
    path: Path  # the file they came from, for the error messages

    def fingerprint(self) -> str:
        """SHA-256 of the logits by window id: --resume refuses a teacher that changed."""
        return fingerprint(self.logits.items())

    def of(self, ids: list[str], student: Tensor) -> Tensor:
        """The windows' logits padded as the student's batch (B, T, 2), PADDING_LOGIT beyond each window."""
        target = torch.full(student.shape, PADDING_LOGIT, dtype=torch.float32)
        for row, i in enumerate(ids):
            logits = self.logits[i]
            target[row, :len(logits)] = torch.from_numpy(logits)
        return target.to(student.device)

    def check_windows(self, windows: QAWindows) -> None:
        """Refuse a teacher whose windows are not the student's: the same ids and token counts (another
        tokenizer, --qa_max_length or --qa_doc_stride cuts them differently), in one ScoresFileError line."""
        for window, length in zip(windows, windows.lengths):
            if window.id not in self.logits:
                raise ScoresFileError(f"{self.path}: no teacher logits for the training window {window.id}; the "
                                      "teacher must have cut this training set into the same windows")
            if len(self.logits[window.id]) != length:
                raise ScoresFileError(f"{self.path}: the teacher's window {window.id} has "
                                      f"{len(self.logits[window.id])} tokens, this run's {length}: another "
                                      "tokenizer or windowing; distil from a teacher with the student's")
