"""The one check of the task modules: each module's TASK is a task, and nothing one task owns is another's.

A task owns more than its fields: its name and aliases (as the command line reads them), its order, its title (the
tables' and figures' label), its per-file flags and its options' flags, the leaderboard files a run writes, its scores
files, its head (the model's attribute and the checkpoint's key prefix), the model's options its options set (a
checkpoint's "heads" keys) and its metric keys. Two tasks sharing any of these would not
fail: one would silently take the other's flags, overwrite its files or train its head. So every claim is listed
here, and the package refuses a second owner of any of them when it is imported, naming both files.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from minbert.tasks.base import Task
from minbert.tasks.course_files import SPLITS

PREDICTED_SPLITS = ("dev", "test")  # the splits a run writes leaderboard files of


class TaskModuleError(ValueError):
    """A module of minbert/tasks/ defines a TASK that is no task, or one claiming what another module's task
    claims; str() is one line naming both files and what they share."""


def claims(task: Task) -> list[tuple[str, object]]:
    """(kind, value): everything `task` owns that no other task may, as the code that uses it reads it. Names and
    file names in lower case: the command line lowers a task's name, and a case-insensitive filesystem (macOS,
    Windows) would give two files differing in case one place. Its scores files (RUN/scores/NAME-SPLIT.csv, SQuAD's
    NAME-train.safetensors), t-SNE figure and per-task layers are named by its name, so that claim covers them."""
    return [*(("name", name.strip().lower()) for name in (task.name, *task.aliases)),  # task_name()'s reading
            ("order", task.order),
            ("title", task.title),
            *(("flag", f"--{task.data_flag(split)}") for split in SPLITS),
            *(("flag", f"--{task.output_flag(split)}") for split in PREDICTED_SPLITS),
            *(("flag", f"--{option.name}") for option in task.options),
            *(("leaderboard file", Path(task.default_output(split)).name.lower()) for split in PREDICTED_SPLITS),
            ("head", task.head_name),
            *(("model option", key) for key in task.head_options(task.own_settings({}))),
            *(("metric key", key) for key, _ in task.model.history_columns)]


def check_task_modules(modules: Mapping[str, object]) -> dict[str, Task]:
    """The tasks of `modules` ({a module's file: its TASK}) by name, in their `order`. TaskModuleError when a TASK is
    not a Task or two of them claim the same thing (a task may repeat its own claims: an alias equal to its name)."""
    owners: dict[tuple[str, object], str] = {}
    for file, task in modules.items():
        if not isinstance(task, Task):
            raise TaskModuleError(f"{file}: its TASK is a {type(task).__name__}, not a task "
                                  "(minbert.tasks.base.Task); a module of shared code defines no TASK")
        if task.calibrated and not callable(getattr(task.outputs, "probabilities", None)):
            raise TaskModuleError(f"{file}: its task is calibrated but has no class probabilities (a "
                                  "minbert.tasks.classification.ClassOutputs')")
        names = getattr(task, "label_names", ())
        if names and len(names) != task.num_classes:
            raise TaskModuleError(f"{file}: its task names {len(names)} classes (label_names) but has "
                                  f"{task.num_classes}")
        for claim in claims(task):
            owner = owners.setdefault(claim, file)
            if owner != file:
                kind, value = claim
                raise TaskModuleError(f"{file}: its {kind} {value!r} is already {owner}'s; two tasks cannot share it")
    return {task.name: task for task in sorted(modules.values(), key=lambda task: task.order)}
