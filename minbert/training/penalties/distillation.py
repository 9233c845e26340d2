"""Distillation from a teacher's saved scores (the loss and the teacher's files are minbert/training/distillation.py's)
as the run's penalty: its flags (--distill, a teacher folder, its weight and temperature, --distill_override
TASK:key=value per task, a task's own teacher folder too; --score_train, which makes a run a teacher), their checks,
the teachers' scores read before the model loads (load) and the penalty that mixes them into the tasks' losses."""
from __future__ import annotations

import math

from minbert.training.distillation import DISTILLED_TASKS, SOFTENED_TASKS, Distillation, load_teacher
from minbert.training.objective import PenaltyFlag, PenaltyKind
from minbert.training.penalties.task_flags import run_tasks, task_overrides
from minbert.training.schedules import train_tasks


def distill_settings(settings) -> dict[str, dict]:
    """Distillation's teacher folder, weight and temperature per task: --distill / --distill_weight /
    --distill_temperature, then any --distill_override TASK:key=value,... (a task's best weight differs, and a
    specialist may teach its task best: RESULTS.md, "Distillation"). teacher "" means the task has none."""
    base = dict(teacher=settings.distill or "", weight=settings.distill_weight,
                temperature=settings.distill_temperature)
    return task_overrides("distill_override", settings.distill_override, base, run_tasks(settings))


def distill_teachers(settings) -> dict[str, str]:
    """The teacher folder of each task that has one."""
    return {task: setting["teacher"] for task, setting in distill_settings(settings).items() if setting["teacher"]}


def distilled_tasks(settings, stages) -> list[str]:
    """The tasks that learn from a --distill teacher: those with one whose train split the stages read, in
    distillation.DISTILLED_TASKS' order."""
    teachers, trained = distill_teachers(settings), train_tasks(stages, run_tasks(settings))
    return [task for task in DISTILLED_TASKS if task in teachers and task in trained]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def check(settings) -> None:
    if settings.distill_override and not distill_teachers(settings):
        raise ValueError("--distill_override sets how tasks learn from a teacher: name one with --distill DIR "
                         "(or TASK:teacher=DIR)")
    for task, setting in distill_settings(settings).items():
        name = "" if not settings.distill_override else f" ({task})"
        if not (_finite(setting["weight"]) and 0 < setting["weight"] <= 1):
            raise ValueError(f"--distill_weight must be in (0, 1], got {setting['weight']}{name}")
        if not (_finite(setting["temperature"]) and setting["temperature"] > 0):
            raise ValueError(f"--distill_temperature must be > 0, got {setting['temperature']}{name}")
        if task not in SOFTENED_TASKS and setting["temperature"] != settings.distill_temperature:
            raise ValueError(f"--distill_override {task}:temperature={setting['temperature']:g}: {task}'s "
                             f"distillation loss has no temperature (only {' and '.join(SOFTENED_TASKS)} soften a "
                             "distribution)")


def check_stages(settings, stages) -> None:
    teachers = distill_teachers(settings)
    if teachers and not distilled_tasks(settings, stages):
        raise ValueError(f"--distill {' '.join(sorted(set(teachers.values())))}: the schedule trains none of "
                         f"{', '.join(teachers)}")


def load(settings, stages, data, task_settings) -> dict | None:
    """--distill's teacher scores of the train examples of every task that learns from one (None without
    --distill), each teacher folder read once."""
    teachers = distill_teachers(settings)
    if not teachers:
        return None
    train_ids = {task: [e.id for e in data[task].train] for task in distilled_tasks(settings, stages)}
    teacher = {}
    for folder in dict.fromkeys(teachers[task] for task in train_ids):
        taught = {task: ids for task, ids in train_ids.items() if teachers[task] == folder}
        teacher |= load_teacher(folder, taught, task_settings)
    per_task = distill_settings(settings)
    print("distillation: the train scores of " + ", ".join(
        f"{task} from {per_task[task]['teacher']} (weight {per_task[task]['weight']}"
        + (f", temperature {per_task[task]['temperature']})" if task in SOFTENED_TASKS else ")")
        for task in train_ids))
    return teacher


def build(settings, model) -> Distillation | None:
    """Distillation from the teachers' scores that `load` read (settings.inputs)."""
    if not settings.inputs:
        return None
    per_task = {task: (setting["weight"], setting["temperature"])
                for task, setting in distill_settings(settings).items()}
    return Distillation(settings.inputs, settings.distill_weight, settings.distill_temperature, per_task)


PENALTY = PenaltyKind(
    name="distillation", title="distillation: a teacher's saved scores on the train splits as soft targets",
    early=True, after="lnsr_noise_std", build=build, check=check, check_stages=check_stages, load=load,
    # a teacher named, for every task or for one (--score_train alone writes scores, it distils nothing)
    on=lambda settings: settings.distill is not None or bool(settings.distill_override), flags={
        "distill": PenaltyFlag(None, "a teacher folder (an scripts/ensemble.py output or a run) whose "
                               "scores/{sst,qqp,sts}-train.csv (SQuAD: scores/qa-train.safetensors) become soft "
                               "targets of the trained tasks", type=None),
        "distill_weight": PenaltyFlag(0.5, "w: each task step trains on (1 - w) x gold loss + w x distillation "
                                      "loss", tunes=True),
        "distill_temperature": PenaltyFlag(1.0, "T of SST's and SQuAD's softened distributions (KL x T^2)",
                                           tunes=True),
        "distill_override": PenaltyFlag([], "per-task setting, e.g. sst:weight=1,temperature=2, sts:weight=0.3 or "
                                        "qqp:teacher=runs/qqp_ensemble (that task's teacher folder; repeatable)",
                                        type=None, action="append", metavar="TASK:key=value,...", tasks="overrides"),
        "score_train": PenaltyFlag(False, "also write the kept model's scores of the train splits "
                                   "(OUTPUT_DIR/scores/TASK-train.csv; SQuAD: every window's start and end logits, "
                                   "qa-train.safetensors): the run can then teach others (--distill)",
                                   type=None, resume_free=True, action="store_true")})
