"""Is one configuration more robust than another? The robustness suite's per-example predictions of several runs
(seeds) per configuration (arm), compared row by row: each arm's clean score, perturbed score and drop (clean minus
perturbed), and each later arm's drop and clean score minus the first arm's, with bootstrap 95% intervals.

    runs = scored_run("a", predictions, report)   # robustness_predictions.json and robustness.json, as read
    problem = mismatch([run_a1, run_b1, ...])     # None when every run was scored on the same inputs
    result = compare_arms({"none": [run_a1, run_a2], "smart": [run_b1, run_b2]}, replicates=2000, seed=0)

The bootstrap is minbert/reports/bootstrap.py's hierarchical one: each replicate draws each set of examples once,
shared by every arm and by a run's clean and perturbed predictions (a drop is paired within its run, a difference
across arms), and draws each arm's runs with replacement, so that an arm of several seeds carries their spread. An
arm of one run carries the examples' spread alone. A difference whose interval holds zero is "not separable".
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from minbert.reports.bootstrap import Difference, Estimate, difference, estimate, hierarchical_replicates
from minbert.reports.seed_tests import seed_difference
from minbert.tasks import TASKS, TEXT_TASKS

INPUT_SETTINGS = ("sets", "attack_steps", "neighbours", "regression_margin")  # robustness.json's, deciding inputs
GREEDY = ("attacked", "success rate", "words per success")  # a greedy row's details, as the suite writes them
PREDICTIONS = "robustness_predictions.json"
# How far a row's recorded score may be from its predictions' score: the same sums in the same order give the same
# float, so only a stray bit of another numpy's summation
SCORE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class FamilyRecord:
    """One run's examples of one task and family, in order: ids, gold labels, clean and each variant's predictions."""
    ids: tuple[str, ...]
    gold: np.ndarray
    clean: np.ndarray
    variants: dict[str, np.ndarray]


@dataclass(frozen=True)
class ScoredRun:
    """One run's suite output: task -> family -> its FamilyRecord, the settings that decide its inputs, and each
    greedy row's details (task -> variant -> details)."""
    name: str
    families: dict[str, dict[str, FamilyRecord]]
    inputs: dict
    greedy: dict[str, dict[str, dict]]


def _array(values: object, count: int, where: str) -> np.ndarray:
    if not isinstance(values, list) or len(values) != count or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{where}: expected {count} numbers")
    found = np.asarray(values, dtype=np.float64)
    if not np.isfinite(found).all():  # JSON as Python reads it takes NaN and Infinity
        raise ValueError(f"{where}: {found[~np.isfinite(found)][0]} is not a finite number")
    return found


def _check_values(task: str, values: np.ndarray, where: str, gold: bool = False) -> None:
    """ValueError naming `where` for a value no run of the suite gives: a gold label outside the task's labels, a
    class outside its classes (a class is predicted from the labels' set), a score outside the range a saved score
    of the task's may take (STS's 0-5)."""
    for value in values:
        if gold or TASKS[task].num_classes:
            problem = TASKS[task].data.label_problem(value)
            problem = problem and f"{value:g} is not {problem}"
        else:
            problem = TASKS[task].outputs.score_problem([value])
        if problem:
            raise ValueError(f"{where}: {problem}")


def _family(task: str, data: object, where: str) -> FamilyRecord:
    if not isinstance(data, dict) or not isinstance(data.get("ids"), list) or not isinstance(data.get("variants"),
                                                                                              dict):
        raise ValueError(f"{where}: expected ids, gold, clean and variants")
    count = len(data["ids"])
    record = FamilyRecord(tuple(map(str, data["ids"])), _array(data.get("gold"), count, f"{where} gold"),
                          _array(data.get("clean"), count, f"{where} clean"),
                          {name: _array(values, count, f"{where} {name}")
                           for name, values in data["variants"].items()})
    _check_values(task, record.gold, f"{where} gold", gold=True)
    for name, values in (("clean", record.clean), *record.variants.items()):
        _check_values(task, values, f"{where} {name}")
    return record


def _report_problem(families: dict[str, dict[str, FamilyRecord]], rows: list[dict]) -> str | None:
    """Why robustness.json's rows are not the scores of robustness_predictions.json's predictions, or None: the two
    files are written together, a row per variant predicted, its clean and perturbed scores those of the predictions
    (a predictions file copied from another run's folder scores otherwise)."""
    predicted = {(task, family, variant) for task, found in families.items() for family, record in found.items()
                 for variant in record.variants}
    listed = set()
    for row in rows:
        key = (row.get("task"), row.get("family"), row.get("variant"))
        if key not in predicted:
            return f"robustness.json: its row {'/'.join(map(str, key))} has no predictions in {PREDICTIONS}"
        listed.add(key)
        record = families[key[0]][key[1]]
        for part, values in (("clean", record.clean), ("perturbed", record.variants[key[2]])):
            score = float(TASKS[key[0]].model.resampled_scores(values[None, :], record.gold[None, :])[0])
            recorded = row[part].get("value") if isinstance(row.get(part), dict) else None
            if not isinstance(recorded, (int, float)) or not abs(score - recorded) <= SCORE_TOLERANCE:
                return (f"{PREDICTIONS}: {'/'.join(key)}'s {part} predictions score {score:.6f}, robustness.json's row "
                        f"{recorded}: they are not the predictions that row was scored from (another run's?)")
    missing = sorted(predicted - listed)
    return f"{PREDICTIONS}: {'/'.join(missing[0])} has no row in robustness.json" if missing else None


def scored_run(name: str, predictions: object, report: object) -> ScoredRun:
    """A run from its robustness_predictions.json and robustness.json as parsed, checked: numbers each task's
    predictions and labels may be, and rows that score those predictions; ValueError saying what is wrong."""
    if not isinstance(predictions, dict) or not all(isinstance(f, dict) for f in predictions.values()):
        raise ValueError(f"{PREDICTIONS}: expected task -> family -> predictions")
    unknown = [task for task in predictions if task not in TEXT_TASKS]
    if unknown:
        raise ValueError(f"{PREDICTIONS}: {unknown[0]!r} is no task the suite scores")
    families = {task: {family: _family(task, data, f"{PREDICTIONS}: {task} {family}")
                       for family, data in found.items()} for task, found in predictions.items()}
    if not isinstance(report, dict) or not isinstance(report.get("settings"), dict) or not isinstance(
            report.get("rows"), list) or not all(isinstance(row, dict) for row in report["rows"]):
        raise ValueError("robustness.json: expected the suite's settings and rows")
    problem = _report_problem(families, report["rows"])
    if problem:
        raise ValueError(problem)
    greedy: dict[str, dict[str, dict]] = {}
    for row in (row for row in report["rows"] if row.get("family") == "greedy"):
        try:
            details = {key: float(row["details"][key]) for key in GREEDY}
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"robustness.json: a greedy row without {', '.join(GREEDY)}") from None
        if not all(math.isfinite(value) and value >= 0 for value in details.values()):
            raise ValueError(f"robustness.json: a greedy row's {', '.join(GREEDY)} are not finite numbers >= 0")
        greedy.setdefault(row["task"], {})[row["variant"]] = details
    return ScoredRun(name, families, {key: report["settings"].get(key) for key in INPUT_SETTINGS}, greedy)


def _names_differ(what: str, ours, theirs) -> str | None:
    """Two sets of names, in any order (--tasks and --families may list them differently)."""
    if set(ours) == set(theirs):
        return None
    return f"its {what} are {', '.join(ours) or 'none'}, not {', '.join(theirs) or 'none'}"


def _differs(first: ScoredRun, run: ScoredRun) -> str | None:
    for key in INPUT_SETTINGS:
        if run.inputs[key] != first.inputs[key]:
            return f"its {key} setting differs ({run.inputs[key]!r}, not {first.inputs[key]!r})"
    problem = _names_differ("tasks", run.families, first.families)
    if problem:
        return problem
    for task, families in first.families.items():
        problem = _names_differ(f"{task} families", run.families[task], families)
        if problem:
            return problem
        for family, record in families.items():
            ours = run.families[task][family]
            problem = _names_differ(f"{task} {family} variants", ours.variants, record.variants)
            if problem:
                return problem
            if ours.ids != record.ids:
                return f"{task} {family}: its example ids differ"
            if not np.array_equal(ours.gold, record.gold):
                return f"{task} {family}: its gold labels differ"
    return None


def mismatch(runs: Sequence[ScoredRun]) -> str | None:
    """'RUN: what differs from FIRST's' for the first run not scored on the first run's inputs (settings that decide
    them, tasks, families, variants, example ids, gold labels), or None."""
    for run in runs[1:]:
        problem = _differs(runs[0], run)
        if problem:
            return f"{run.name}: {problem} (from {runs[0].name}'s)"
    return None


@dataclass(frozen=True)
class VariantResult:
    """One task, family and variant: per arm its clean score, perturbed score and drop; per later arm, its drop minus
    the first arm's."""
    task: str
    family: str
    variant: str
    examples: int
    clean: dict[str, Estimate]
    perturbed: dict[str, Estimate]
    drop: dict[str, Estimate]
    minus_baseline: dict[str, Difference]
    run_drops: dict[str, list[float]]  # per arm, each run's drop on all the examples: the figure seed_test compares


@dataclass(frozen=True)
class CleanResult:
    """One task and family's examples: per arm its clean score; per later arm, that minus the first arm's."""
    task: str
    family: str
    examples: int
    clean: dict[str, Estimate]
    minus_baseline: dict[str, Difference]


@dataclass(frozen=True)
class GreedyResult:
    """One greedy row, per arm: its runs' mean success rate, words changed per success (pooled over its runs'
    successes; 0 with none) and each run's success rate."""
    task: str
    variant: str
    success_rate: dict[str, float]
    words_per_success: dict[str, float]
    run_success_rates: dict[str, list[float]]


@dataclass(frozen=True)
class RobustnessComparison:
    arms: dict[str, list[str]]  # arm -> its runs' names, the first arm the baseline
    replicates: int
    seed: int
    variants: list[VariantResult]
    clean: list[CleanResult]
    greedy: list[GreedyResult]

    def as_json(self) -> dict:
        return asdict(self)


def _statistic(parts: dict[tuple[str, str], str]):
    """A run's scores on each replicate's examples: (task, family, "", "clean") and (task, family, variant,
    "perturbed" / "drop") -> (R,); `parts` gives each (task, family) the part its examples are drawn as."""
    def scores(run: ScoredRun, rows: dict[str, np.ndarray]) -> dict[tuple, np.ndarray]:
        found = {}
        for task, families in run.families.items():
            for family, record in families.items():
                index = rows[parts[task, family]]
                gold = record.gold[index]
                clean = found[task, family, "", "clean"] = TASKS[task].model.resampled_scores(record.clean[index], gold)
                for variant, predicted in record.variants.items():
                    perturbed = TASKS[task].model.resampled_scores(predicted[index], gold)
                    found[task, family, variant, "perturbed"] = perturbed
                    found[task, family, variant, "drop"] = clean - perturbed
        return found
    return scores


def compare_arms(arms: Mapping[str, Sequence[ScoredRun]], replicates: int, seed: int) -> RobustnessComparison:
    """Every estimate, for runs that mismatch() finds scored on the same inputs; the first arm is the baseline."""
    first = next(iter(arms.values()))[0]
    # families scored on the same examples (char and word; the two attacks) share a part: one draw per replicate
    parts, sizes, seen = {}, {}, {}
    for task, families in first.families.items():
        for family, record in families.items():
            parts[task, family] = seen.setdefault((task, record.ids), f"{task} {len(seen)}")
            sizes[parts[task, family]] = len(record.ids)
    statistic = _statistic(parts)
    replicated = hierarchical_replicates(arms, sizes, statistic, replicates, seed)
    whole = {part: np.arange(size)[None, :] for part, size in sizes.items()}
    on_all = {name: [statistic(run, whole) for run in runs] for name, runs in arms.items()}  # each run's values
    points = {name: {key: float(np.mean([scores[key][0] for scores in found])) for key in found[0]}
              for name, found in on_all.items()}  # the mean over an arm's runs
    baseline = next(iter(arms))

    def estimates(key: tuple) -> dict[str, Estimate]:
        return {name: estimate(points[name][key], replicated[name][key]) for name in arms}

    def versus(key: tuple) -> dict[str, Difference]:
        return {name: difference(points[name][key] - points[baseline][key],
                                 replicated[name][key] - replicated[baseline][key]) for name in list(arms)[1:]}
    variants, clean = [], []
    for task, families in first.families.items():
        for family, record in families.items():
            clean.append(CleanResult(task, family, len(record.ids), estimates((task, family, "", "clean")),
                                     versus((task, family, "", "clean"))))
            variants += [VariantResult(task, family, variant, len(record.ids), clean[-1].clean,
                                       estimates((task, family, variant, "perturbed")),
                                       estimates((task, family, variant, "drop")),
                                       versus((task, family, variant, "drop")),
                                       {name: [float(scores[task, family, variant, "drop"][0]) for scores in found]
                                        for name, found in on_all.items()}) for variant in record.variants]
    greedy = [_greedy(arms, task, variant) for task, found in first.greedy.items() for variant in found]
    return RobustnessComparison({name: [run.name for run in runs] for name, runs in arms.items()}, replicates, seed,
                                variants, clean, greedy)


def variant_problem(run: ScoredRun, task: str, family: str, variant: str) -> str | None:
    """Why `run` has no row TASK FAMILY VARIANT to compare, in one line, or None."""
    record = run.families.get(task, {}).get(family)
    if record is not None and variant in record.variants:
        return None
    rows = [f"{t}/{f}/{v}" for t, families in run.families.items() for f, record in families.items()
            for v in record.variants]
    return f"no row {task}/{family}/{variant} in {run.name}'s results (its rows: {', '.join(rows)})"


def seed_test(result: RobustnessComparison, arm: str, task: str, family: str, variant: str) -> Difference:
    """`arm`'s drop on the row minus the first arm's over the seeds: each run's own drop on all the examples, an
    exact permutation p (seed_tests.py); each arm needs two runs or more."""
    row = next(row for row in result.variants if (row.task, row.family, row.variant) == (task, family, variant))
    return seed_difference(row.run_drops[arm], row.run_drops[next(iter(result.arms))])


def _greedy(arms: Mapping[str, Sequence[ScoredRun]], task: str, variant: str) -> GreedyResult:
    rates, words = {}, {}
    for name, runs in arms.items():
        details = [run.greedy.get(task, {}).get(variant, {}) for run in runs]
        rates[name] = [d.get("success rate", 0.0) for d in details]
        successes = [d.get("success rate", 0.0) * d.get("attacked", 0.0) for d in details]
        changed = sum(d.get("words per success", 0.0) * count for d, count in zip(details, successes))
        words[name] = changed / sum(successes) if sum(successes) else 0.0
    return GreedyResult(task, variant, {name: float(np.mean(found)) for name, found in rates.items()}, words, rates)
