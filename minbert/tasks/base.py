"""The task interface: what differs between tasks, declared once per task, so that the modules that use tasks (the
model's heads, evaluation, the scores files, ensembles, distillation) ask the task and never test its name.

A task is one object, `TASK`, in one module of this folder (sst.py, ...); __init__.py finds it there.
Its fields say who it is and where its files and flags are, and `options` its own settings (TaskOption: each a flag
of multitask_classifier.py, a --config and args.json key; check_settings(settings, pair_encoders) checks their
values, head_options(settings) says what they set of the model). Its behaviour is three parts, each a small
interface that its kind implements, so that a new kind of task implements three small classes:

    task.data     TaskData: load(path, split) -> examples; tokenize(cache, examples, ...) -> what its batches are
                  cut from; check_inputs(data, ...): what the pretrained model cannot read with the run's settings
    task.model    TaskModel: feature_size, has_head, build_head: its head; outputs(model, hidden, inputs): the head's
                  outputs from the encoder's last hidden states; objective(options): loss, score, decision, SMART
                  divergence; distillation_loss; decide(scores) -> predictions, decide_at(scores, threshold) (QQP's
                  threshold chosen on dev); metrics(predictions, gold) -> its history keys, history_columns,
                  kept_score; evaluate(predictor, examples, chosen): a run's metrics of a split, with what they come from
    task.outputs  TaskOutputs: format_prediction / parse_prediction: its leaderboard CSV cells; score_columns,
                  write_scores, read_scores: its saved scores; predict_scores and write_outputs: a run's leaderboard file
                  and scores of a split; train_scores and write_train_scores: --score_train's, which load_teacher reads
                  back as a distillation teacher; ensemble_terms, ensemble_predictions, teacher_scores
                  (prediction/ensemble_scores.py)

A part reads its task's declared fields through `part.task`. A task module declares its task from a kind that names
its three parts: classification.py's Classification (classes predicted from saved scores, accuracy and F1, vote and
mean ensembles) and SentenceClassification (one sentence, C logits: SST, CFIMDB), pairs.py's parts of the two
sentences of QQP and STS and the encodings of a pair. `calibrated` marks a classification task whose dev ECE,
reliability diagram and temperature a run reports (calibration.py). The course's files are read by course_files.py,
scores files by score_files.py; metrics.py holds the metrics' maths.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from minbert.files import atomic_write_csv
from minbert.tasks.course_files import SPLITS
from minbert.tasks.score_files import (ScoresFileError, TeacherScores, as_saved, logit_problem, read_score_rows,
                                       scores_path, write_score_rows)

COURSE_SPLIT_NAMES = {"train": "train", "dev": "dev", "test": "test-student"}  # the course's file name of a split
HEADS_GROUP = "model heads"  # the --help group of the options that shape a task's head or objective


@dataclass(frozen=True)
class TaskOption:
    """A setting of one task: the flag --NAME of multitask_classifier.py (NAME is also its key in a --config and a
    run's args.json), its default and --help text, the --help group it is listed in, and what argparse needs to
    read it (`argparse`: type, choices or action, as add_argument takes them)."""
    name: str
    default: object
    help: str
    group: str = HEADS_GROUP
    argparse: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskEvaluation:
    """A task's evaluation on a split (TaskModel.evaluate): its metrics under their history keys, the predictions they
    score ((ids, predictions, gold labels); SQuAD: its answers by question id) and the scores those were decided
    from ((ids, scores); SQuAD: the same answers), what write_outputs writes of a dev split."""
    metrics: dict[str, float]
    predictions: object
    scores: object


def first_few(items: Iterable[str], limit: int = 3) -> str:
    """A few of `items`, sorted, and how many more: 'a, b, c (+2 more)'."""
    items = sorted(items)
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


@dataclass(frozen=True, kw_only=True, eq=False)
class OwnOptions:
    """A task's own settings: the options it declares, and what it reads of them. `settings` is every task's options
    by name (tasks.task_settings), wherever they are passed: each task reads its own."""
    options: tuple[TaskOption, ...] = ()

    def own_settings(self, settings: Mapping[str, object]) -> dict[str, object]:
        """Its options' values in `settings`, each one's default where absent."""
        return {option.name: settings.get(option.name, option.default) for option in self.options}

    def check_settings(self, settings: Mapping[str, object], pair_encoders: Mapping[str, str]) -> None:
        """Refuse (ValueError naming the flag) values of its options that cannot work, alone or with the pairs'
        encoders (MultitaskBERT.pair_encoders)."""

    def head_options(self, settings: Mapping[str, object]) -> dict[str, object]:
        """What its options set of the model: MultitaskBERT's task options, under a checkpoint's "heads" keys."""
        return {}


class TaskPart:
    """One of a task's three parts (TaskData, TaskModel, TaskOutputs), made by the task for itself: it reads the
    task's declared fields (name, title, columns, classes, ...) through `task`."""

    def __init__(self, task: Task):
        self.task = task


class TaskData(TaskPart, ABC):
    """task.data: its examples, from its files to what its batches are cut from."""

    @abstractmethod
    def load(self, path: str | Path, split: str) -> list:
        """Its examples in a data file, validated: every problem a DataError naming the file (and line)."""

    def tokenize(self, cache, examples: Sequence, max_length: int, joint_pairs: bool, settings: Mapping[str, object]):
        """What its batches are cut from, tokenised once per run by `cache` (data.batches.TokenizationCache): its
        examples, each pair as one sequence when `joint_pairs`."""
        return cache.get(examples, max_length, joint_pairs)

    def check_inputs(self, data, tokenizer, settings: Mapping[str, object],
                     check_length: Callable[[int, str], None]) -> None:
        """Refuse (ValueError) its splits (`data`: data.batches.TaskData) that the pretrained model cannot read with
        the run's settings, before its weights load; `check_length(length, flag)` refuses a length beyond the model's
        positions. Nothing by default: a text longer than --max_length is cut."""


class TaskModel(TaskPart, ABC):
    """task.model: its head and objective, the decisions of its scores and the metrics of those decisions."""

    def feature_size(self, pair_encoders: Mapping[str, str], hidden: int) -> int | None:
        """The width of the features its head reads (a per-task dense layer's input, with --head_hidden); None when
        the head reads the encoder's hidden states as they are."""
        return hidden

    def has_head(self, pair_encoders: Mapping[str, str]) -> bool:
        """Whether a linear head gives its output (an SBERT cosine has none)."""
        return True

    @abstractmethod
    def build_head(self, in_features: int) -> nn.Module:
        """A fresh head on `in_features` features."""

    def head(self, model: nn.Module) -> nn.Module:
        return getattr(model, self.task.head_name)

    @abstractmethod
    def outputs(self, model: nn.Module, hidden: Tensor, inputs) -> Tensor:
        """Its outputs from the encoder's last hidden states (B, T, H) (or (2B, T, H): an SBERT pair's two sides) of
        `inputs` (multitask_bert.EncoderInputs), through the model's pooling, dense layer, dropout and its head."""

    def check_options(self, options: Mapping[str, object]) -> None:
        """Refuse (ValueError) the model's options (MultitaskBERT.head_options') that cannot work for this task."""

    @abstractmethod
    def objective(self, options: Mapping[str, object]):
        """Its objective under these head options (losses.py): loss, score, decision and SMART's divergence."""

    @abstractmethod
    def distillation_loss(self, objective, outputs: Tensor, teacher, ids: list[str], temperature: float) -> Tensor:
        """How far the student's `outputs` on the examples `ids` are from the teacher's scores of them (`teacher`:
        what task.outputs.load_teacher gave), in the space the runs save scores in; 0 where they agree."""

    @abstractmethod
    def decide(self, scores: Tensor) -> Tensor:
        """The predictions its saved scores decide: the one rule of a run's CSVs and an ensemble's members."""

    def decide_at(self, scores: Tensor, threshold: float) -> Tensor:
        """The predictions of its saved scores at a decision `threshold` (has_threshold's tasks)."""
        raise ValueError(f"{self.task.name} has no decision threshold")

    @abstractmethod
    def metrics(self, predictions, gold) -> dict[str, float]:
        """Its dev metrics under their history keys (sst_acc, ...)."""

    def evaluate(self, predictor, examples: list, chosen: Mapping[str, float] | None) -> TaskEvaluation:
        """Its metrics on labelled `examples`, predicted by `predictor` (inference.Predictor). `chosen`: the dev
        metrics whose decision settings the predictions use (SQuAD's no-answer threshold); None: a dev evaluation,
        which chooses them. The default decides every example from its own scores: there is nothing to choose."""
        ids, scores = predictor.predict(self.task.name, examples, scores=True)
        predicted = self.decide(torch.from_numpy(scores)).numpy()
        gold = np.array([e.label for e in examples])
        return TaskEvaluation(self.metrics(predicted, gold), (ids, predicted, gold), (ids, scores))

    @property
    @abstractmethod
    def history_columns(self) -> tuple[tuple[str, str], ...]:
        """(metric key, table label) of the dev metrics that tables and figures show, its own score first."""

    @property
    def score_key(self) -> str:
        """Its own dev score, on its own scale (the continual-learning figures' task score)."""
        return self.history_columns[0][0]

    def kept_score(self, metrics: Mapping[str, float]) -> float:
        """Its share of the score that picks the model a run keeps, on [0, 1]."""
        return metrics[self.score_key]

    def resampled_scores(self, predictions: np.ndarray, gold: np.ndarray) -> np.ndarray:
        """Its score_key's metric of each row of (R, N) resampled examples: (R,), what a bootstrap recomputes."""
        raise TypeError(f"{self.task.name}: its score has no resampled form (bootstrap intervals cover SST, QQP and "
                        "STS)")


class TaskOutputs(TaskPart, ABC):
    """task.outputs: the files a run writes of it (leaderboard files, scores files, --score_train's teacher scores),
    and what ensembles and distillation read of those."""

    @property
    @abstractmethod
    def score_columns(self) -> tuple[str, ...]:
        """The columns of its scores files (RUN/scores/TASK-SPLIT.csv) after the id."""

    @abstractmethod
    def format_prediction(self, value) -> str:
        """A prediction as its leaderboard CSV writes it; ValueError if it is none of its."""

    @abstractmethod
    def parse_prediction(self, text: str) -> int | float:
        """A leaderboard CSV cell back into a prediction; ValueError on anything the grader would refuse."""

    def rounding_effect(self, predictions: np.ndarray) -> float:
        """How far the run's recorded score may be from the score of its CSV's `predictions` (parsed back), which
        format_prediction rounded: 0 where it writes them exactly (class numbers)."""
        return 0.0

    def write_predictions(self, path: str | os.PathLike, ids: Sequence, predictions: Sequence) -> None:
        """Its leaderboard CSV (prediction_rows), moved into place whole (a crash leaves no truncated file)."""
        atomic_write_csv(path, prediction_rows(self.task, path, ids, predictions))

    def predict_scores(self, predictor, examples: list):
        """The model's scores of `examples` (a split without labels too), as evaluate gives them: what write_outputs
        writes. Every rank predicts (a collective under torchrun)."""
        return predictor.predict(self.task.name, examples, scores=True)

    def write_outputs(self, scores, predictions_path: Path, scores_file: Path, chosen: Mapping[str, float]) -> str:
        """A split's leaderboard file (decided from the scores as saved) and, for ensembles, the `scores`
        (predict_scores') under the decision settings `chosen` on dev (TaskModel.evaluate); what it wrote, in words."""
        ids, (values, predictions) = scores[0], decided(self.task, scores[1])
        self.write_predictions(predictions_path, ids, predictions.tolist())
        self.write_scores(scores_file, ids, values)
        return f"{len(ids)} rows"

    def train_scores(self, predictor, examples: list):
        """--score_train: the model's scores of its train `examples`, what a student distils from; by default those
        its leaderboard files are decided from (predict_scores). Every rank predicts (a collective under torchrun)."""
        return self.predict_scores(predictor, examples)

    def train_scores_file(self, run_dir: str | os.PathLike) -> Path:
        """Where write_train_scores writes them and load_teacher reads them (RUN/scores/TASK-train.csv)."""
        return scores_path(run_dir, self.task.name, "train")

    def write_train_scores(self, run_dir: str | os.PathLike, scores, settings: Mapping[str, object]) -> str:
        """train_scores' `scores` in run_dir/scores/ (train_scores_file), where load_teacher reads them. Returns the
        file and what it holds, in words."""
        ids, values = scores
        path = self.train_scores_file(run_dir)
        self.write_scores(path, ids, values)
        return f"{path} ({len(ids)} rows)"

    def score_problem(self, numbers: list[float]) -> str | None:
        """Why a row of its saved scores is no model's, or None."""
        return logit_problem(numbers)

    def write_scores(self, path: str | os.PathLike, ids: Sequence[str], scores: np.ndarray) -> None:
        """Its scores file: one row per id, in the order given."""
        scores = np.asarray(scores, dtype=np.float64).reshape(len(ids), -1)
        if scores.shape[1] != len(self.score_columns):
            raise ValueError(f"{path}: {self.task.name} has {len(self.score_columns)} score column(s), "
                             f"got {scores.shape[1]}")
        write_score_rows(path, self.score_columns, ids, scores)

    def read_scores(self, path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
        """(ids, scores): (N, columns), or (N,) for one column. ScoresFileError on any problem."""
        ids, scores = read_score_rows(path, self.score_columns, self.score_problem)
        return ids, scores if len(self.score_columns) > 1 else scores[:, 0]

    def load_teacher(self, run_dir: str | os.PathLike, ids: list[str], settings: Mapping[str, object] | None):
        """A teacher's train scores of the examples `ids` (the student's) from its folder; ScoresFileError naming
        the file when it is missing or lacks one of them. `settings`: the student's (None: unknown)."""
        path = scores_path(run_dir, self.task.name, "train")
        if not path.is_file():
            raise ScoresFileError(f"{path}: no train scores for --distill; write them with --score_train (a run) "
                                  "or scripts/ensemble.py --score_train (an ensemble of such runs)")
        teacher_ids, scores = self.read_scores(path)
        rows = {i: row for row, i in enumerate(teacher_ids)}
        missing = [i for i in ids if i not in rows]
        if missing:
            raise ScoresFileError(f"{path}: no teacher score for {len(missing)} of the {len(ids)} {self.task.name} "
                                  f"training examples (e.g. id {missing[0]}); the teacher must have scored this "
                                  "training set")
        return TeacherScores(rows, scores.reshape(len(teacher_ids), -1))

    # -- ensembles (tasks with ensemble_methods) ---------------------------------------------------
    def ensemble_terms(self, scores: np.ndarray, weight: float, method: str) -> np.ndarray:
        """What one member with these saved scores adds to the ensemble's running sum."""
        raise ValueError(f"scripts/ensemble.py combines no {self.task.name} scores")

    def ensemble_predictions(self, total: np.ndarray, weights: list[float], method: str) -> np.ndarray:
        """The ensemble's predictions from the sum of its members' terms (`weights`: one per member)."""
        raise ValueError(f"scripts/ensemble.py combines no {self.task.name} scores")

    def weighs_members(self, method: str) -> bool:
        """Whether `method` weighs each member by its dev metric (member_weights)."""
        return False

    def member_weights(self, method: str, chosen: list[int], metrics: list[float]) -> list[float] | None:
        """The weights of the chosen members (their dev `metrics` by index) for a method that weighs_members; None
        for the others."""
        return None

    def ensemble_problem(self, method: str, metrics: list[float]) -> str | None:
        """Why members with these dev metrics cannot be combined by `method`, or None."""
        return None

    def teacher_scores(self, members: list[np.ndarray], shares: np.ndarray) -> np.ndarray:
        """An ensemble's soft scores in the runs' score space, its members' weighted by `shares` (summing to 1)."""
        raise ValueError(f"scripts/ensemble.py combines no {self.task.name} scores")


def check_weights(title: str, weights: list[float] | None, members: int) -> None:
    """A weighted combination of `title`'s members needs one non-negative weight per member, and not all of them
    zero."""
    if weights is None or len(weights) != members or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"weighted {title} needs one non-negative weight per member, not all zero")


@dataclass(frozen=True, kw_only=True, eq=False)
class Task(OwnOptions):
    """One task: its declared fields (who it is, where its files and flags are, what it is made of), and its three
    parts, each made from the class its kind names: `data` (TaskData), `model` (TaskModel), `outputs`
    (TaskOutputs)."""
    data_part: ClassVar[type[TaskData]]
    model_part: ClassVar[type[TaskModel]]
    outputs_part: ClassVar[type[TaskOutputs]]
    name: str  # the internal name: code, stage syntax, metric keys, checkpoints, scores files
    order: int  # where it comes in every list of tasks, and so in what order the model creates its head
    default: bool = False  # one of the multitask model's default tasks, those of the course's leaderboard (MULTITASK)
    trainable: bool = False  # multitask_classifier.py can train it (--tasks; RUN_TASKS)
    part1: bool = False  # classifier.py trains it (the handout's part 1)
    aliases: tuple[str, ...] = ()  # the course's names for it, accepted on the command line
    file_prefix: str  # the course's data files: {file_prefix}-{train,dev,test-student}.csv
    flag_prefix: str  # the course's flags: --{flag_prefix}_{train,dev,test} and --{flag_prefix}_{dev,test}_out
    file_names: tuple[str, str, str] | None = None  # train, dev and test files when not the course's CSV names
    output_extension: str = "csv"  # of its predictions files
    label_column: str
    text_columns: tuple[str, ...]
    leaderboard_column: str  # the predictions CSV's second column
    num_classes: int | None = None  # labels and predictions are 0 .. num_classes - 1; None: not classes
    title: str  # its name in tables and figures: "SST", "SQuAD"
    head_name: str  # the model's attribute holding its head: the checkpoint's key prefix
    ensemble_methods: tuple[str, ...] = ()  # scripts/ensemble.py's ways to combine members, default first
    softens: bool = False  # its distillation loss compares distributions at a temperature
    test_file_optional: bool = False  # a run without its test file predicts dev only (SQuAD's official test is hidden)
    plots_embeddings: bool = False  # a run plots its dev sentences' embeddings by gold label (TASK_tsne.png)
    # Its dev score in words when that score picks SimCSE's best epoch (--simcse_keep best): SimCSE trains sentence
    # embeddings for what a similarity task measures. "" for the others.
    simcse_score: str = ""
    headless_output: str = "output"  # what its outputs are called in messages when it has no head: STS's "cosine"
    # A classification task whose dev probabilities a run calibrates (tasks/calibration.py, reports/calibration.py):
    # their ECE and reliability diagram, a temperature fitted on dev, which predict.py and ensembles apply when asked.
    calibrated: bool = False
    has_threshold: bool = False  # its decision is a threshold on one logit, which may be chosen on dev (decide_at)
    data: TaskData = field(init=False, repr=False)
    model: TaskModel = field(init=False, repr=False)
    outputs: TaskOutputs = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "data", self.data_part(self))
        object.__setattr__(self, "model", self.model_part(self))
        object.__setattr__(self, "outputs", self.outputs_part(self))

    @property
    def is_pair(self) -> bool:
        """Each example is two sentences."""
        return len(self.text_columns) == 2

    def file_name(self, split: str) -> str:
        """Its data file's name, e.g. quora-test-student.csv."""
        if self.file_names is not None:
            return self.file_names[SPLITS.index(split)]
        return f"{self.file_prefix}-{COURSE_SPLIT_NAMES[split]}.csv"

    def data_flag(self, split: str) -> str:
        return f"{self.flag_prefix}_{split}"

    def output_flag(self, split: str) -> str:
        return f"{self.flag_prefix}_{split}_out"

    def default_output(self, split: str) -> str:
        """Where its predictions go by default: the handout's submission names, e.g. predictions/para-dev-out.csv."""
        return f"predictions/{self.flag_prefix}-{split}-out.{self.output_extension}"


def decided(task: Task, scores: np.ndarray, threshold: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the scores as a scores file holds them, `task`'s predictions decided from those, at a decision `threshold`
    chosen on dev if given): a run's leaderboard files are decided from the scores as saved, so that an ensemble of
    this one run, or predict.py, decides the same."""
    values = torch.from_numpy(as_saved(scores))
    predictions = task.model.decide(values) if threshold is None else task.model.decide_at(values, threshold)
    return values.numpy(), predictions.numpy()


def prediction_rows(task: Task, where: str | os.PathLike, ids: Sequence, predictions: Sequence) -> list[tuple]:
    """`task`'s leaderboard CSV rows in the order given, `id,<leaderboard_column>` first; ValueError naming `where`
    for a count that differs or a repeated id."""
    ids = [str(i) for i in ids]
    if len(ids) != len(predictions):
        raise ValueError(f"{where}: {len(ids)} ids but {len(predictions)} predictions")
    repeated = [i for i, count in Counter(ids).items() if count > 1]
    if repeated:
        raise ValueError(f"{where}: repeated ids: {first_few(repeated)}")
    return [("id", task.leaderboard_column), *zip(ids, map(task.outputs.format_prediction, predictions))]
