"""What is trained when: the stages of a run, the task order inside a multi-task epoch, and the
learning-rate schedule.

Stage syntax (sequential schedule): a comma-separated list of `task[:fraction][*repeats]`, e.g.
'qqp,sts*2,qqp:0.03' = one QQP epoch, two STS epochs, one epoch on a random 3% of QQP; `mlm` is a
masked-language-model epoch on the three tasks' training sentences ('mlm:0.5,qqp': half an epoch first);
`qa` a SQuAD epoch (over its windows) when the run has the task.

A multi-epoch stage (what --patience stops early) is a run of two or more consecutive stages that train the same
heads on the same data: equal task stages, however written ('sts*10', 'sts,sts', or a cycle of one task), or the
epochs of an annealed / round_robin schedule. mlm and simcse stages have no dev metric of their own and never form
one.
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from minbert.tasks import MULTITASK, RUN_TASKS, task_name

SCHEDULES = ("sequential", "annealed", "round_robin")
LR_SCHEDULES = ("constant", "linear")
# What the stage after a block of repeated stages (block_length) starts from: the block's last weights, or those of
# its stage with the best dev score of what the block trains (the thesis' sequential runs, tables 4.3-4.9).
STAGE_STARTS = ("last", "best")


class StageKind(Enum):
    TASK = "task"            # one task's training set (or a fraction of it)
    MLM = "mlm"              # masked-language-model training on the tasks' sentences
    SIMCSE = "simcse"        # supervised SimCSE on NLI triplets
    MULTITASK = "multitask"  # one annealed or round-robin epoch over every task of the run


@dataclass(frozen=True)
class Stage:
    kind: StageKind
    task: str | None = None
    fraction: float = 1.0
    epoch: int = 1  # 1-based epoch within a multi-task schedule (annealing needs it)

    @property
    def label(self) -> str:
        """The stage's name in logs, histories and checkpoints: 'qqp', 'qqp@0.03', 'mlm', 'simcse', 'multitask-2'."""
        if self.kind in (StageKind.TASK, StageKind.MLM):
            name = self.task if self.kind is StageKind.TASK else StageKind.MLM.value
            return name if self.fraction == 1.0 else f"{name}@{self.fraction:g}"
        return self.kind.value if self.kind is StageKind.SIMCSE else f"multitask-{self.epoch}"


def parse_stage_list(text: str, tasks: tuple[str, ...] = MULTITASK) -> list[Stage]:
    """'qqp,sts*2,qqp:0.03' -> stages; ':f' trains on a fraction f of the task, '*n' repeats it n times.
    `tasks`: the run's, the only ones a stage may train."""
    stages = []
    for token in filter(None, (t.strip() for t in text.split(","))):
        stage_text, _, count = token.partition("*")
        name, _, fraction = (part.strip() for part in stage_text.partition(":"))
        try:
            task = None if name == StageKind.MLM.value else task_name(name, RUN_TASKS)
        except ValueError:
            raise ValueError(f"unknown stage {name!r} in {text!r}; use {', '.join(tasks)} or mlm "
                             "(optionally :fraction, *repeats)") from None
        if task is not None and task not in tasks:
            raise ValueError(f"stage {name!r} in {text!r} trains {task}, which is not among the run's tasks "
                             f"({', '.join(tasks)}); add it to --tasks or name the stages")
        try:
            repeat = int(count) if count else 1
            value = float(fraction) if fraction else 1.0
        except ValueError:
            raise ValueError(f"stage {token!r} in {text!r}: write task[:fraction][*repeats], "
                             "e.g. qqp:0.03 or sts*2") from None
        if repeat < 1:
            raise ValueError(f"stage {token!r}: the repeat count must be >= 1")
        if not 0 < value <= 1:
            raise ValueError(f"stage {token!r}: the fraction must be in (0, 1]")
        stages += [Stage(StageKind.TASK, task, value) if task else Stage(StageKind.MLM, fraction=value)] * repeat
    return stages


def build_schedule(schedule: str, first_stages: str = "", cycle: str = "", cycles: int = 0, epochs: int = 1,
                   simcse_epochs: int = 0, mlm_epochs: int = 0, tasks: tuple[str, ...] = MULTITASK) -> list[Stage]:
    """MLM epochs, then SimCSE epochs, then either first_stages + cycle * cycles (sequential) or `epochs`
    multi-task epochs (annealed, round_robin) of the run's `tasks`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    stages = [Stage(StageKind.MLM)] * mlm_epochs + [Stage(StageKind.SIMCSE)] * simcse_epochs
    if schedule == "sequential":
        stages += parse_stage_list(first_stages, tasks) + parse_stage_list(cycle, tasks) * cycles
    else:
        stages += [Stage(StageKind.MULTITASK, epoch=e) for e in range(1, epochs + 1)]
    if not stages:
        raise ValueError("the schedule is empty: give first stages, a cycle with cycles >= 1, or epochs")
    return stages


def multi_epoch_stages(stages: list[Stage]) -> list[range | None]:
    """For each stage, the positions of the multi-epoch stage (see the module's docstring) it belongs to, or None."""
    def key(stage: Stage):
        if stage.kind is StageKind.TASK:
            return stage
        return StageKind.MULTITASK if stage.kind is StageKind.MULTITASK else None
    groups: list[range | None] = []
    start = 0
    for end in range(1, len(stages) + 1):
        if end == len(stages) or key(stages[end]) is None or key(stages[end]) != key(stages[start]):
            group = range(start, end) if key(stages[start]) is not None and end - start > 1 else None
            groups += [group] * (end - start)
            start = end
    return groups


def patience_exhausted(scores: list[float], patience: int) -> bool:
    """Whether a multi-epoch stage should stop repeating: `scores` are its task's dev score before its first epoch,
    then after each epoch so far; true when none of the last `patience` epochs beat the best score before them."""
    return len(scores) > patience and max(scores[-patience:]) <= max(scores[:-patience])


def block_length(stages: list[Stage], index: int) -> int:
    """How many stages the block of stage `index` has: a block is a run of equal consecutive stages ('sts*10' is one
    block of ten, 'qqp,sts,sst' three of one, 'simcse' x 3 one of three), which --stage_start best and --simcse_keep
    best resolve when the next block begins."""
    start, end = index, index
    while start > 0 and stages[start - 1] == stages[index]:
        start -= 1
    while end + 1 < len(stages) and stages[end + 1] == stages[index]:
        end += 1
    return end - start + 1


def annealed_probabilities(sizes: dict[str, int], epoch: int, epochs: int) -> dict[str, float]:
    """p_i proportional to N_i^alpha, alpha = 1 - 0.8 (e - 1) / (E - 1): from size-proportional to near-uniform."""
    alpha = 1.0 if epochs == 1 else 1 - 0.8 * (epoch - 1) / (epochs - 1)
    weights = {task: n ** alpha for task, n in sizes.items()}
    total = sum(weights.values())
    return {task: w / total for task, w in weights.items()}


def multitask_order(schedule: str, sizes: dict[str, int], epoch: int, epochs: int, steps: int,
                    rng: random.Random) -> list[str]:
    """The task of each of `steps` batches in one multi-task epoch: drawn with annealed probabilities
    of the train set sizes, or the tasks in turn (round_robin)."""
    tasks = list(sizes)
    if schedule == "annealed":
        probabilities = annealed_probabilities(sizes, epoch, epochs)
        return rng.choices(tasks, weights=[probabilities[t] for t in tasks], k=steps)
    if schedule == "round_robin":
        return [tasks[i % len(tasks)] for i in range(steps)]
    raise ValueError(f"no multi-task order for schedule {schedule!r}")


def train_tasks(stages: list[Stage], tasks: tuple[str, ...] = MULTITASK) -> set[str]:
    """The tasks of the run's `tasks` whose train sets a schedule reads (a multi-task epoch reads all of them,
    an mlm stage the sentences of sst, qqp and sts)."""
    read = {s.task for s in stages if s.kind is StageKind.TASK}
    if any(s.kind is StageKind.MULTITASK for s in stages):
        read |= set(tasks)
    if any(s.kind is StageKind.MLM for s in stages):
        read |= set(MULTITASK) & set(tasks)
    return read


def trained_heads(stages: list[Stage], tasks: tuple[str, ...] = MULTITASK) -> set[str]:
    """The tasks whose heads the stages train, whose dev scores pick the model a run keeps (a multi-task epoch
    trains every head of the run's `tasks`; SimCSE and MLM stages none)."""
    if any(stage.kind is StageKind.MULTITASK for stage in stages):
        return set(tasks)
    return {stage.task for stage in stages if stage.kind is StageKind.TASK}


def tasks_trained_by(label: str, tasks: Iterable[str]) -> set[str]:
    """The tasks among `tasks` whose heads the stage named `label` (Stage.label, as a run's history records it)
    trained: its own for a task stage ('qqp', 'qqp@0.03'), every one for a multi-task epoch ('multitask-2'), none
    for 'mlm', 'simcse' or the history's record of the model before training."""
    if label.startswith(StageKind.MULTITASK.value + "-"):
        return set(tasks)
    return {label.partition("@")[0]} & set(tasks)


def learning_rate_factor(update: int, total_updates: int, schedule: str = "constant",
                         warmup_ratio: float = 0.1) -> float:
    """Multiplier of the base learning rate at optimizer update `update` (0-based) of `total_updates`.

    constant: 1 throughout (the course's).
    linear: linear warm-up over the first warmup_ratio of the updates, then linear decay towards 0
    (the last update gets 1 / (total - warm-up); the SMART paper's schedule: 10% warm-up).
    """
    if schedule == "constant":
        return 1.0
    if schedule != "linear":
        raise ValueError(f"learning-rate schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    warmup = int(warmup_ratio * total_updates)
    if update < warmup:
        return (update + 1) / (warmup + 1)
    return max(0.0, (total_updates - update) / max(1, total_updates - warmup))
