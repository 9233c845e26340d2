"""The tasks and their names, in one table.

Each task has one internal name, used by the code, the stage syntax, metric keys and checkpoints:

    sst     SST-5 sentiment (5 classes)
    qqp     Quora Question Pairs paraphrase detection (0 / 1)
    sts     STS-B semantic similarity (0-5)
    cfimdb  CFIMDB sentiment (0 / 1), part 1 of the handout only

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

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("sst", "ids-sst", "sst", "sentiment", ("sentence",), "Predicted_Sentiment", 5),
    Task("qqp", "quora", "para", "is_duplicate", ("sentence1", "sentence2"), "Predicted_Is_Paraphrase", 2,
         aliases=("quora", "para")),
    Task("sts", "sts", "sts", "similarity", ("sentence1", "sentence2"), "Predicted_Similarity", None),
    Task("cfimdb", "ids-cfimdb", "cfimdb", "sentiment", ("sentence",), "Predicted_Sentiment", 2),
)}
MULTITASK = ("sst", "qqp", "sts")  # the three tasks of the multitask model, in the course's order
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
    """The course's file name, e.g. ('qqp', 'test') -> 'quora-test-student.csv'."""
    return f"{TASKS[task].file_prefix}-{_FILE_SPLITS[split]}.csv"


def data_flag(task: str, split: str) -> str:
    """The course's flag for a data file, e.g. ('qqp', 'train') -> 'para_train'."""
    return f"{TASKS[task].flag_prefix}_{split}"


def output_flag(task: str, split: str) -> str:
    """The course's flag for a predictions file, e.g. ('qqp', 'dev') -> 'para_dev_out'."""
    return f"{TASKS[task].flag_prefix}_{split}_out"


def default_output(task: str, split: str) -> str:
    """The path the handout's submission instructions require, e.g. ('qqp', 'dev') ->
    'predictions/para-dev-out.csv' (the starter code's defaults said -output.csv)."""
    return f"predictions/{TASKS[task].flag_prefix}-{split}-out.csv"
