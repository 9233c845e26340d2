"""The tasks and their names, in one table.

Each task has one internal name, used by the code, the stage syntax, metric keys and checkpoints:

    sst     SST-5 sentiment (5 classes)
    qqp     Quora Question Pairs paraphrase detection (0 / 1)
    sts     STS-B semantic similarity (0-5)
    cfimdb  CFIMDB sentiment (0 / 1), part 1 of the handout only
    qa      SQuAD 2.0 extractive question answering (a span of the context, or no answer), the fourth
            task of seed 002; official JSON files, read by squad.py

The course names some of them otherwise: its files are quora-*.csv, its flags --para_train and
--para_dev_out, its submission files para-*-out.csv. Those names are mapped here and nowhere else;
on the command line the course's names are accepted as aliases of the internal one.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str  # the internal name
    file_prefix: str  # course data files: {file_prefix}-{train,dev,test-student}.csv
    flag_prefix: str  # course flags: --{flag_prefix}_{train,dev,test} and --{flag_prefix}_{dev,test}_out
    label_column: str
    text_columns: tuple[str, ...]
    leaderboard_column: str  # the predictions CSV's second column
    num_classes: int | None  # labels and predictions are 0 .. num_classes - 1; None: a 0-5 similarity score
    aliases: tuple[str, ...] = ()
    file_names: tuple[str, str, str] | None = None  # train, dev, test files when not the course's CSV names

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    @property
    def is_extractive(self) -> bool:
        """SQuAD's question answering: JSON files, an answer span per question, JSON predictions."""
        return self.file_names is not None


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("sst", "ids-sst", "sst", "sentiment", ("sentence",), "Predicted_Sentiment", 5),
    Task("qqp", "quora", "para", "is_duplicate", ("sentence1", "sentence2"), "Predicted_Is_Paraphrase", 2,
         aliases=("quora", "para")),
    Task("sts", "sts", "sts", "similarity", ("sentence1", "sentence2"), "Predicted_Similarity", None),
    Task("cfimdb", "ids-cfimdb", "cfimdb", "sentiment", ("sentence",), "Predicted_Sentiment", 2),
    # The official SQuAD 2.0 file names (the official test set is hidden; this project's protocol has one).
    Task("qa", "squad", "squad", "answers", (), "answer", None, aliases=("squad",),
         file_names=("train-v2.0.json", "dev-v2.0.json", "test-v2.0.json")),
)}
MULTITASK = ("sst", "qqp", "sts")  # the three tasks of the multitask model, in the course's order
PAIR_TASKS = tuple(name for name, task in TASKS.items() if task.is_pair)  # qqp, sts: each example is two sentences
RUN_TASKS = (*MULTITASK, "qa")  # the tasks a multitask run may train (--tasks), in this order
SPLITS = ("train", "dev", "test")
_FILE_SPLITS = {"train": "train", "dev": "dev", "test": "test-student"}
_BY_ANY_NAME = {alias: task.name for task in TASKS.values() for alias in (task.name, *task.aliases)}


def class_range(task: str) -> str:
    """The classes of a classification task in words: '0 or 1', 'an integer 0-4'."""
    n = TASKS[task].num_classes
    return "0 or 1" if n == 2 else f"an integer 0-{n - 1}"


def task_name(name: str, allowed: tuple[str, ...] = MULTITASK) -> str:
    """The internal name for an internal name or a course alias ('quora', 'para' -> 'qqp')."""
    canonical = _BY_ANY_NAME.get(name.strip().lower())
    if canonical not in allowed:
        names = ", ".join(allowed)
        raise ValueError(f"unknown task {name!r}; use one of {names}")
    return canonical


def course_file_name(task: str, split: str) -> str:
    """The course's file name, e.g. ('qqp', 'test') -> 'quora-test-student.csv'; SQuAD's official one for qa."""
    if TASKS[task].file_names is not None:
        return TASKS[task].file_names[SPLITS.index(split)]
    return f"{TASKS[task].file_prefix}-{_FILE_SPLITS[split]}.csv"


def data_flag(task: str, split: str) -> str:
    """The course's flag for a data file, e.g. ('qqp', 'train') -> 'para_train'."""
    return f"{TASKS[task].flag_prefix}_{split}"


def output_flag(task: str, split: str) -> str:
    """The course's flag for a predictions file, e.g. ('qqp', 'dev') -> 'para_dev_out'."""
    return f"{TASKS[task].flag_prefix}_{split}_out"


def default_output(task: str, split: str) -> str:
    """The path the handout's submission instructions require, e.g. ('qqp', 'dev') ->
    'predictions/para-dev-out.csv' (the starter code's defaults said -output.csv); for qa the official
    SQuAD predictions JSON, 'predictions/squad-dev-out.json'."""
    extension = "json" if TASKS[task].is_extractive else "csv"
    return f"predictions/{TASKS[task].flag_prefix}-{split}-out.{extension}"
