"""A sweep's settings (Sweep), the parameters of its space (Parameter) and its one-line refusal (SweepError)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

# Flags the sweep sets for every trial: a space or the base flags naming them would be overridden.
SWEEP_FLAGS = ("output_dir", "resume", "config", "help")


class SweepError(ValueError):
    """A sweep that cannot start or go on as asked: one line, exit code 2."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One flag of the space: a float or int range (log scale, step) or a list of choices; `when`: the values of
    earlier parameters under which it is searched (unset otherwise, so the base run's value holds)."""
    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()
    when: tuple[tuple[str, tuple], ...] = ()

    def values_to_check(self) -> list:
        return list(self.choices) if self.kind == "choices" else [self.low, self.high]

    def searched_under(self, chosen: dict) -> bool:
        """Whether `chosen` (the earlier parameters' values) meets every condition of its 'when'."""
        return all(name in chosen and chosen[name] in values for name, values in self.when)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A sweep's settings: the study, where its runs go, the space, the base run's flags and what is scored."""
    study: str
    folder: Path
    storage: str
    storage_shown: str  # where the storage came from and its URL without the password, for messages
    space: tuple[Parameter, ...]
    base: tuple[str, ...]
    objective: str
    direction: str
    seeds: tuple[int, ...]
    trials: int
    timeout: float | None
    pruner: str
    startup_trials: int
    warmup_stages: int  # the median pruner's: the stages of every trial it never stops at
    heartbeat: int
    enqueued: tuple[dict, ...] = ()  # configurations queued before the sampler's, e.g. a recipe's own settings
