"""What the penalties' flags that name tasks resolve to (a helper of the penalty files, itself no penalty): a
comma-separated list of tasks, and per-task overrides (--smart_override, --distill_override). The command line has
already rewritten both in the internal task names and the run's order (training_args.name_tasks)."""
from __future__ import annotations


def named_tasks(text: str) -> tuple[str, ...]:
    """The tasks of a validated flag that names some, comma-separated."""
    return tuple(task for task in text.split(",") if task)


def run_tasks(settings) -> tuple[str, ...]:
    """The run's tasks (its --tasks, validated), in RUN_TASKS' order."""
    return named_tasks(settings.tasks)


def task_overrides(flag: str, overrides: list[str], base: dict, tasks: tuple[str, ...]) -> dict[str, dict]:
    """`base` for every task, then each --FLAG TASK:key=value[,key=value] applied to its task (each value of
    its base value's type; TASK an internal name, as training_args.name_tasks leaves it)."""
    per_task = {task: dict(base) for task in tasks}
    for override in overrides:
        task, _, settings = override.partition(":")
        if task not in per_task or not settings:
            raise ValueError(f"--{flag} {override!r}: expected TASK:key=value[,key=value]")
        for setting in settings.split(","):
            key, _, value = setting.partition("=")
            if key not in base:
                raise ValueError(f"--{flag} {override!r}: unknown or shared setting {key!r}")
            try:
                per_task[task][key] = type(base[key])(value)
            except ValueError:
                raise ValueError(f"--{flag} {override!r}: {key} must be a "
                                 f"{type(base[key]).__name__}, got {value!r}") from None
    return per_task
