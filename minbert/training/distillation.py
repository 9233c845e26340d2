"""Knowledge distillation from saved scores: a teacher (an ensemble from scripts/ensemble.py, or any run written
with --score_train) has left its outputs on the training examples in TEACHER/scores/{task}-train.csv
(minbert/data/scores.py); a student trains on the mix (1 - w) * gold loss + w * distillation loss, with no teacher
model in memory.

    teacher = load_teacher("runs/ensemble", {"sst": sst_train_ids, ...})     # refuses scores that miss an id
    distillation = Distillation(teacher, weight=0.5, temperature=2.0)
    loss = distillation.mix("sst", gold_loss, objective, outputs, batch["ids"])

Each task reads its teacher's file and has its own distillation loss (minbert/tasks/: load_teacher,
distillation_loss; the losses themselves are minbert/tasks/losses.py's): SST's softened KL of its 5 logits, QQP's
Bernoulli KL of its logit, STS's squared error of the 0-5 score on its gold loss's scale, SQuAD's softened KL of the
start and end logits of every window. They compare scores in the space the runs save them in, so a teacher is any
folder of saved scores, whatever model or ensemble wrote them. (scripts/ensemble.py combines no SQuAD scores: a
SQuAD teacher is one run.)
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from minbert.tasks import RUN_TASKS, TASKS
from minbert.tasks.losses import Objective
from minbert.tasks.qa import TeacherSpans
from minbert.tasks.score_files import ScoresFileError, TeacherScores, check_train_scores
from minbert.training.objective import Penalty, TaskForward

DISTILLED_TASKS = RUN_TASKS  # the tasks whose saved scores a student can learn from: every task a run trains
SOFTENED_TASKS = tuple(task for task in RUN_TASKS if TASKS[task].softens)  # those that soften at a temperature


def load_teacher(run_dir: str | Path, train_ids: dict[str, list[str]],
                 task_settings: Mapping[str, object] | None = None) -> dict[str, TeacherScores | TeacherSpans]:
    """The teacher's train scores of every task in `train_ids` (the student's training ids per task; SQuAD's
    question ids). A missing file, or one that lacks an id the student trains on (another data set, or a teacher
    written with fewer training examples), raises ScoresFileError naming the file; so does SQuAD's when its
    windows are not those of the student's `task_settings` (tasks.task_settings; None: not checked), and a file
    the teacher's scores/train.json does not tie to its current model (score_files.check_train_scores)."""
    if not Path(run_dir).is_dir():
        raise ScoresFileError(f"{run_dir}: not a folder; --distill names a teacher's folder (a run written with "
                              "--score_train, or scripts/ensemble.py --score_train's output)")
    # scores/train.json ties the files to the teacher's model; another run's copied in is refused (none: unchecked)
    check_train_scores(run_dir, [TASKS[task].outputs.train_scores_file(run_dir) for task in train_ids])
    return {task: TASKS[task].outputs.load_teacher(run_dir, ids, task_settings) for task, ids in train_ids.items()}


@dataclass(frozen=True)
class Distillation(Penalty):
    """The teacher's scores and how a student's loss mixes them in: (1 - weight) * gold + weight * distillation,
    with `weight` and `temperature` unless `per_task` gives a task its own (weight, temperature). As a penalty
    (objective.Penalty) it mixes the task's loss rather than adding a term, and a resume must find the teacher's
    scores unchanged (fingerprints)."""
    teacher: dict[str, TeacherScores | TeacherSpans]
    weight: float = 0.5
    temperature: float = 1.0
    per_task: dict[str, tuple[float, float]] = field(default_factory=dict)
    name = "distillation"

    def __post_init__(self):
        for weight, temperature in [(self.weight, self.temperature), *self.per_task.values()]:
            if not (math.isfinite(weight) and 0 < weight <= 1):
                raise ValueError(f"the distillation weight must be in (0, 1], got {weight!r}")
            if not (math.isfinite(temperature) and temperature > 0):
                raise ValueError(f"the distillation temperature must be > 0, got {temperature!r}")

    def fingerprints(self) -> dict[str, str]:
        """The teacher's scores of each task, as --resume compares them ("distill/TASK")."""
        return {f"distill/{task}": teacher.fingerprint() for task, teacher in self.teacher.items()}

    def applies_to(self, task: str) -> bool:
        return task in self.teacher

    def add_to(self, loss: Tensor, forward: TaskForward) -> tuple[Tensor, dict[str, Tensor]]:
        return self.mix(forward.task, loss, forward.objective, forward.outputs, forward.batch["ids"]), {}

    def setting(self, task: str) -> tuple[float, float]:
        """The task's (weight, temperature)."""
        return self.per_task.get(task, (self.weight, self.temperature))

    def mix(self, task: str, gold_loss: Tensor, objective: Objective, outputs: Tensor, ids: list[str]) -> Tensor:
        """The task's training loss on a batch of the model's `outputs` (its objective's): gold and teacher mixed (the
        gold loss alone for a task the teacher has no scores of)."""
        if task not in self.teacher:
            return gold_loss
        weight, temperature = self.setting(task)
        soft = TASKS[task].model.distillation_loss(objective, outputs, self.teacher[task], ids, temperature)
        return (1 - weight) * gold_loss + weight * soft
