"""How sure a dev score is, and whether two configurations differ: a bootstrap over the dev examples and, where an
arm has several runs (seeds), over the runs too.

    arms = [Arm("none", [run_a1, run_a2]), Arm("smart", [run_b1, run_b2])]   # run: task -> (predictions, gold)
    result = compare(arms, MULTITASK, replicates=2000, seed=0)
    result.scores["smart"]["overall"]            # Estimate(value, low, high): the mean over its runs, 95% interval
    result.differences["smart"]["overall"]       # Difference(value, low, high, p) against the first arm

Each replicate draws every task's dev examples with replacement, the same draw for every arm and run, so that
differences are paired: an example that every model finds hard is hard in both arms of a replicate and cancels.
Each arm's runs are drawn with replacement too (a hierarchical bootstrap), so that an arm of several seeds carries
the seeds' spread as well as the examples'; an arm of one run carries the examples' alone, and its interval says
nothing about another seed. Intervals are the replicates' 2.5th and 97.5th percentiles; a difference's p is the
two-sided share of replicates on the other side of zero, and an interval that holds zero means "not separable".
hierarchical_replicates is the same draw for any statistic of a run (minbert/reports/robustness_comparison.py: a
run's drops under perturbation).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from minbert.tasks import MULTITASK, TASKS

OVERALL = "overall"
Run = TypeVar("Run")
CHUNK = 100  # replicates drawn at once: QQP's 20,000 dev examples x 100 x a run's predictions stay a few MB


@dataclass(frozen=True)
class Arm:
    """A configuration's runs (seeds): each run's dev predictions and gold labels per task, in one shared order."""
    name: str
    runs: Sequence[dict[str, tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Difference(Estimate):
    p: float

    @property
    def separable(self) -> bool:
        return not self.low <= 0 <= self.high


@dataclass(frozen=True)
class Comparison:
    scores: dict[str, dict[str, Estimate]]  # arm -> task (or "overall") -> its estimate
    differences: dict[str, dict[str, Difference]]  # arm after the first -> task -> it minus the first arm


MIN_REPLICATES = 100  # fewer cannot place a 2.5th and a 97.5th percentile apart
# At 100,000 replicates a 95% interval's ends carry a Monte Carlo error of about 0.4% of its half-width (normal
# draws: sqrt(0.025 * 0.975 / R) / phi(1.96) in units of sigma); more only takes longer: 1e9 ran for hours, as a hang.
MAX_REPLICATES = 100_000


def arms_problem(names: Sequence[str], replicates: int) -> str | None:
    """What makes a comparison of arms named `names` at `replicates` replicates impossible, in one line, or None."""
    if replicates < MIN_REPLICATES:
        return f"--replicates must be >= {MIN_REPLICATES} for a 95% interval, got {replicates}"
    if replicates > MAX_REPLICATES:
        return f"--replicates must be <= {MAX_REPLICATES}: more changes the interval by less than its own noise and " \
               f"only takes longer, got {replicates}"
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    return f"arms: {repeated[0]!r} names two arms" if repeated else None


def run_scores(run: dict[str, tuple[np.ndarray, np.ndarray]], tasks: Sequence[str],
               rows: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A run's score of each task (and the overall score when `tasks` are the course's three) on each row of example
    indices `rows` (task -> (R, N)); on all its examples, as (1,) arrays, without `rows`."""
    scores = {}
    for task in tasks:
        predictions, gold = run[task]
        index = rows[task] if rows is not None else np.arange(len(gold))[None, :]
        scores[task] = TASKS[task].model.resampled_scores(predictions[index], gold[index])
    if tuple(tasks) == MULTITASK:  # the course's overall score: the mean of the tasks' shares (STS: (r + 1) / 2)
        scores[OVERALL] = sum(TASKS[task].model.kept_score({TASKS[task].model.score_key: scores[task]}) for task in tasks) / 3
    return scores


def hierarchical_replicates(arms: Mapping[str, Sequence[Run]], sizes: Mapping[str, int],
                            statistic: Callable[[Run, dict[str, np.ndarray]], dict[Hashable, np.ndarray]],
                            replicates: int, seed: int) -> dict[str, dict[Hashable, np.ndarray]]:
    """Each arm's (replicates,) values of every key `statistic` gives. Per replicate, each part's examples (`sizes`:
    part -> N) are drawn with replacement once, shared by every arm and run, and each arm's runs are drawn with
    replacement; a value is the mean, over the drawn runs, of statistic(run, rows) (rows: part -> (R, N) indices,
    what it gives: key -> (R,))."""
    generator = np.random.default_rng(seed)
    drawn: dict[str, dict[Hashable, list[np.ndarray]]] = {name: {} for name in arms}
    for start in range(0, replicates, CHUNK):
        count = min(CHUNK, replicates - start)
        rows = {part: generator.integers(0, size, (count, size)) for part, size in sizes.items()}
        for name, runs in arms.items():
            picks = generator.integers(0, len(runs), (count, len(runs)))
            per_run = [statistic(run, rows) for run in runs]
            for key in per_run[0]:
                values = np.stack([scores[key] for scores in per_run], axis=1)[np.arange(count)[:, None], picks]
                drawn[name].setdefault(key, []).append(values.mean(1))
    return {name: {key: np.concatenate(parts) for key, parts in keys.items()} for name, keys in drawn.items()}


def compare(arms: Sequence[Arm], tasks: Sequence[str], replicates: int = 2000, seed: int = 0) -> Comparison:
    """Every arm's scores with 95% intervals, and every later arm's difference from the first."""
    sizes = {task: len(arms[0].runs[0][task][1]) for task in tasks}
    replicated = hierarchical_replicates({arm.name: arm.runs for arm in arms}, sizes,
                                         lambda run, rows: run_scores(run, tasks, rows), replicates, seed)
    points = {}  # each arm's scores on all its examples, the mean over its runs
    for arm in arms:
        on_all = [run_scores(run, tasks) for run in arm.runs]
        points[arm.name] = {key: float(np.mean([scores[key][0] for scores in on_all])) for key in on_all[0]}
    scores = {name: {key: estimate(points[name][key], values) for key, values in keys.items()}
              for name, keys in replicated.items()}
    first = arms[0].name
    differences = {arm.name: {key: difference(points[arm.name][key] - points[first][key],
                                              replicated[arm.name][key] - replicated[first][key])
                              for key in replicated[first]} for arm in arms[1:]}
    return Comparison(scores, differences)


def estimate(value: float, replicates: np.ndarray) -> Estimate:
    """`value` with the 95% interval of its bootstrap `replicates`."""
    low, high = np.percentile(replicates, [2.5, 97.5])
    return Estimate(value, float(low), float(high))


def difference(value: float, replicates: np.ndarray) -> Difference:
    """A difference `value` with its replicates' 95% interval and two-sided p."""
    low, high = np.percentile(replicates, [2.5, 97.5])
    other_side = min((replicates <= 0).mean(), (replicates >= 0).mean())
    return Difference(value, float(low), float(high), float(min(1.0, 2 * other_side)))
