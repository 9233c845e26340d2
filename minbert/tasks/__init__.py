"""The tasks, one module each in this folder, and the names the rest of the code reads them by.

Each task has one internal name, used by the code, the stage syntax, metric keys and checkpoints:

    sst     SST-5 sentiment (5 classes)                                             minbert/tasks/sst.py
    qqp     Quora Question Pairs paraphrase detection (0 / 1)                       minbert/tasks/qqp.py
    sts     STS-B semantic similarity (0-5)                                         minbert/tasks/sts.py
    cfimdb  CFIMDB sentiment (0 / 1), part 1 of the handout only                    minbert/tasks/cfimdb.py
    qa      SQuAD 2.0 extractive question answering (a span of the context, or      minbert/tasks/qa.py
            no answer), the fourth task of seed 002; official JSON files

The course names some of them otherwise: its files are quora-*.csv, its flags --para_train and
--para_dev_out, its submission files para-*-out.csv. Each task maps its own names (minbert/tasks/base.py's fields);
on the command line the course's names are accepted as aliases of the internal one.

A task is the TASK object of a module here (a tasks.base.Task): every module of this folder is looked at when the
package is imported, so a new task is a new file and nothing else. Its fields place it: `order` in every list of
tasks, `default` among the multitask model's default tasks, `trainable` by multitask_classifier.py, `part1` by
classifier.py, `simcse_score` among the tasks whose dev score picks SimCSE's best epoch. What a task owns (its
names, order, title, flags, leaderboard and scores files, head, metric keys) is its alone: registry.py refuses a
second owner, and a TASK that is no task, in one line naming both files, when the package is imported. A task's own
settings are its `options` (base.TaskOption): multitask_classifier.py's flags, --config and args.json keys are made
from them, and the task reads them (base.OwnOptions).
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from minbert.files import refused_at_import
from minbert.tasks import classification
from minbert.tasks.base import Task
from minbert.tasks.course_files import SPLITS  # noqa: F401 (tasks.SPLITS: the splits of every task)
from minbert.tasks.registry import TaskModuleError, check_task_modules


def _discover() -> tuple[dict[str, Task], dict[str, str]]:
    """Every module's TASK, by name, in their `order`, checked by registry.check_task_modules (TaskModuleError for a
    TASK that is no task or two tasks claiming one name, flag, file, head, ...), and each task's module file. A
    module without TASK is shared code (base, classification, ...)."""
    modules = {}
    for module in pkgutil.iter_modules(__path__):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        if hasattr(loaded, "TASK"):
            modules[f"minbert/tasks/{module.name}.py"] = loaded.TASK
    return check_task_modules(modules), {task.name: file for file, task in modules.items()}


TASKS: dict[str, Task]
TASK_FILES: dict[str, str]  # for messages: 'qqp' -> 'minbert/tasks/qqp.py'
with refused_at_import(TaskModuleError):
    TASKS, TASK_FILES = _discover()

MULTITASK = tuple(name for name, task in TASKS.items() if task.default)  # the course's three, in its order
RUN_TASKS = tuple(name for name, task in TASKS.items() if task.trainable)  # what --tasks may name, in this order
PART1_TASKS = tuple(name for name, task in TASKS.items() if task.part1)  # classifier.py's, in this order
PAIR_TASKS = tuple(name for name, task in TASKS.items() if task.is_pair)  # qqp, sts: each example is two sentences
# What --tasks may name whose examples are sentences, which predict.py and the robustness suite read (SQuAD's
# questions are not lines of text)
TEXT_TASKS = tuple(name for name in RUN_TASKS if TASKS[name].text_columns)
SIMCSE_TASKS = tuple(name for name, task in TASKS.items() if task.simcse_score)  # sts: picks SimCSE's best epoch
_BY_ANY_NAME = {alias: task.name for task in TASKS.values() for alias in (task.name, *task.aliases)}


def class_range(task: str) -> str:
    """The classes of a classification task in words: '0 or 1', 'an integer 0-4'."""
    return classification.class_range(TASKS[task].num_classes)


def task_name(name: str, allowed: tuple[str, ...] = MULTITASK) -> str:
    """The internal name for an internal name or a course alias ('quora', 'para' -> 'qqp')."""
    canonical = _BY_ANY_NAME.get(name.strip().lower())
    if canonical not in allowed:
        names = ", ".join(allowed)
        raise ValueError(f"unknown task {name!r}; use one of {names}")
    return canonical


def course_file_name(task: str, split: str) -> str:
    """The course's file name, e.g. ('qqp', 'test') -> 'quora-test-student.csv'; SQuAD's official one for qa."""
    return TASKS[task].file_name(split)


def data_flag(task: str, split: str) -> str:
    """The course's flag for a data file, e.g. ('qqp', 'train') -> 'para_train'."""
    return TASKS[task].data_flag(split)


def output_flag(task: str, split: str) -> str:
    """The course's flag for a predictions file, e.g. ('qqp', 'dev') -> 'para_dev_out'."""
    return TASKS[task].output_flag(split)


def default_output(task: str, split: str) -> str:
    """The path the handout's submission instructions require, e.g. ('qqp', 'dev') ->
    'predictions/para-dev-out.csv' (the starter code's defaults said -output.csv); for qa the official
    SQuAD predictions JSON, 'predictions/squad-dev-out.json'."""
    return TASKS[task].default_output(split)


def task_settings(values: Mapping[str, object]) -> dict[str, object]:
    """Every task's options (Task.options) by name, as `values` give them (a run's settings, its recorded args), each
    one's default where `values` lacks it (a record older than the option): what the tasks read their own from."""
    return {name: value for task in TASKS.values() for name, value in task.own_settings(values).items()}


def head_options(settings: Mapping[str, object]) -> dict[str, object]:
    """What the tasks' options (`settings`, as task_settings reads them) set of the model, every task's: MultitaskBERT's
    task options, under a checkpoint's "heads" keys."""
    return {key: value for task in TASKS.values()
            for key, value in task.head_options(task.own_settings(settings)).items()}
