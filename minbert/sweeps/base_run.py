"""The base run's checks before the first trial: its flags leave the trials' folders to the sweep, it records the
objective, and every data file it reads is there."""
from __future__ import annotations

import difflib
from pathlib import Path

from minbert.run.training_args import TrainingArguments, data_paths, run_schedule, run_tasks
from minbert.sweeps.settings import SWEEP_FLAGS, SweepError
from minbert.tasks import MULTITASK, TASKS, data_flag
from minbert.training.schedules import train_tasks


def check_objective(objective: str, run: TrainingArguments) -> None:
    """--objective is a dev metric that the base run records: the overall score of a run of the three default tasks,
    or a metric of one of its tasks."""
    tasks = run_tasks(run)
    known = ["overall"] if set(MULTITASK) <= set(tasks) else []
    for task in tasks:
        keys = metric_keys(task)
        if keys is None and objective.startswith(f"{task}_"):
            return  # its metrics cannot be listed before it answers: the first stage's record checks the name
        known += keys or [key for key, _ in TASKS[task].model.history_columns]
    if objective in known:
        return
    close = difflib.get_close_matches(objective, known, 1)
    raise SweepError(f"--objective {objective}: not a dev metric of the base run's tasks ({', '.join(tasks)}), "
                     + (f"did you mean {close[0]!r}?" if close else f"e.g. {', '.join(known)}"))


def metric_keys(task: str) -> list[str] | None:
    """The dev metrics a task records, those of its metrics of two toy predictions; None for a task whose metrics
    come from its answers (SQuAD's)."""
    import numpy as np
    try:
        return list(TASKS[task].model.metrics(np.array([0, 1]), np.array([0, 1])))
    except ValueError:
        return None


def check_data_files(run: TrainingArguments) -> None:
    """Every data file the base run reads is there: missing, every trial would fail on it."""
    tasks = run_tasks(run)
    trained = train_tasks(run_schedule(run), tasks)
    needed = [path for (task, split), path in data_paths(run.data_dir, run.data_files, tasks).items()
              if (split != "train" or task in trained) and not (
                  split == "test" and TASKS[task].test_file_optional and not run.data_files.get(data_flag(task, split)))]
    for path in [*needed, *map(Path, run.simcse_data)]:
        if not path.is_file():
            problem = "not a regular file" if path.exists() else "no such file"
            raise SweepError(f"the base flags after --: {path}: {problem} (every trial would read it)")


def check_base(base: list[str]) -> None:
    given = [word for word in base if word.startswith("--") and word[2:].split("=")[0] in SWEEP_FLAGS[:2]]
    if given:
        raise SweepError(f"the base flags after -- give {given[0]}: each trial's folder and resuming are the sweep's")
