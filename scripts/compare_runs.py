"""Are two configurations' dev scores different, or within noise? Each arm's SST and QQP accuracy, STS Pearson's r
and overall score from its runs' saved dev predictions (the kept model's leaderboard CSVs), with a bootstrap 95%
interval over the dev examples and, for an arm of several runs (seeds), over its runs too; then each later arm's
difference from the first, paired on the same examples, with its interval, a two-sided p and whether the two are
separable (minbert/reports/bootstrap.py says how).

    python scripts/compare_runs.py --data_dir ../shared/data/protocol \\
        none=results/cpu_forgetting/none,results/cpu_forgetting/none_seed1,results/cpu_forgetting/none_seed2 \\
        ewc=results/cpu_forgetting/ewc_1e6,results/cpu_forgetting/ewc_1e6_seed1,results/cpu_forgetting/ewc_1e6_seed2

An arm is NAME=RUN[,RUN...], or one run's folder (named by its folder). A run's dev CSVs are found as
scripts/error_analysis.py finds them (its recorded paths, else RUN/predictions/). With --part1 the runs are
classifier.py's (the handout's part 1): a RUN is the --predictions_dir of one --option, holding
OPTION-{sst,cfimdb}-dev-out.csv, and the columns are SST's and CFIMDB's accuracy.

When every run is a sequential one (its history.json has the continual-learning figures), a second table compares
the arms' backward transfer and mean forgetting: a figure each run has once, so the seeds are its only sample; the
interval is a bootstrap over each arm's runs and p an exact permutation test (minbert/reports/seed_tests.py), which
decides: "not separable" unless p < 0.05 (with a handful of runs the bootstrap's interval is too narrow). It needs
two runs or more in every arm. Its last column says what each arm's stages were scored on, which those figures
measure: every dev example, or a fixed subset (--max_eval_examples); an arm whose runs differ there is refused.

--primary [ARM:]FIGURE declares the study's one primary comparison before its tables: FIGURE (bwt or forgetting for
sequential runs, or a score: sst, qqp, sts, overall; sst, cfimdb with --part1) of ARM's runs (the second arm when not
named) against the first arm's, decided by the exact permutation test over the seeds (each run's own figure) at
p < 0.05. It is printed first. Every other difference is secondary: a family whose p values are Holm-corrected
(minbert/reports/decisions.py); each shows its raw p, its adjusted p and "survives" (adjusted p < 0.05, interval
without zero) or "not separable". Without --primary every comparison is secondary.

A run's CSVs must be its own (minbert/run/run_outputs.py, checked_predictions_and_gold): each scores the dev metric
its best.json (or an ensemble's ensemble.json) records, and a run that did not train a task is refused, not
credited with whatever CSV sits at its recorded path. An arm names each run once, and its runs trained the same
tasks (their overall scores are averaged); two arms of the same runs are refused (their difference is 0 by
construction).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from evaluation import PredictionsFileError
from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.data.batches import DataError, show_data_warnings_on_one_line
from minbert.files import repeated_arm, repeated_run
from minbert.reports.bootstrap import OVERALL, Arm, Comparison, Difference, arms_problem, compare, run_scores
from minbert.reports.decisions import ALPHA, holm, parse_primary, secondary_verdict
from minbert.reports.seed_tests import seed_difference
from minbert.prediction.run_evaluation import SUBSET_KEY, kept_record_mismatch
from minbert.reports.tables import BEFORE_TRAINING, history_forgetting_measures
from minbert.run.run_outputs import checked_predictions_and_gold, part1_predictions_and_gold, run_record
from minbert.tasks import MULTITASK, PART1_TASKS, TASKS


def columns(tasks: tuple[str, ...]) -> list[tuple[str, str]]:
    """The table's (key, title) columns: each task's score, and the overall score for the course's three tasks."""
    scores = [(task, f"{TASKS[task].title} {TASKS[task].model.score_key.split('_')[-1]}") for task in tasks]
    return scores + ([(OVERALL, "overall")] if tuple(tasks) == MULTITASK else [])


def parse_arm(text: str) -> tuple[str, list[Path]]:
    name, _, runs = text.rpartition("=") if "=" in text else (Path(text).name, "", text)
    folders = [Path(run) for run in runs.split(",") if run]
    if not name or not folders:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=RUN[,RUN...] or a run's folder")
    missing = [str(folder) for folder in folders if not folder.is_dir()]
    if missing:
        raise argparse.ArgumentTypeError(f"{missing[0]}: not a run's folder")
    problem = repeated_run(folders)
    if problem:
        raise argparse.ArgumentTypeError(f"{name}: {problem}")
    return name, folders


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", type=parse_arm, help="NAME=RUN[,RUN...] or RUN; the first is the baseline")
    parser.add_argument("--data_dir", required=True, help="the course's dev files the runs predicted")
    parser.add_argument("--replicates", type=int, default=2000)
    parser.add_argument("--seed", type=rng_seed, default=0)
    parser.add_argument("--part1", action="store_true", help="the runs are classifier.py's (SST, CFIMDB)")
    parser.add_argument("--primary", metavar="[ARM:]FIGURE",
                        help="the comparison that decides, over the seeds: bwt, forgetting or a score of ARM (the "
                             "second arm by default) against the first arm; every other one is secondary")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.arms]
    problem = arms_problem(names, args.replicates) or repeated_arm(args.arms) or (
        primary_problem(args) if args.primary else None)
    if problem:
        parser.error(problem)
    return args


def primary_figures(part1: bool) -> dict[str, str]:
    """--primary's FIGURE names -> the key of the figure compared."""
    tasks = PART1_TASKS if part1 else MULTITASK
    return {**{short: key for key, short in FIGURE_NAMES.items() if not part1}, **{task: task for task in tasks},
            **({OVERALL: OVERALL} if not part1 else {})}


def primary_problem(args: argparse.Namespace) -> str | None:
    """What makes --primary impossible before anything is read, in one line, or None."""
    runs = dict(args.arms)
    try:
        arm, figure = parse_primary(args.primary, list(runs))
    except ValueError as err:
        return str(err)
    if figure not in primary_figures(args.part1):
        return f"--primary: {figure!r} is none of {', '.join(primary_figures(args.part1))}"
    small = [name for name in (args.arms[0][0], arm) if len(runs[name]) < 2]
    return (f"--primary: {small[0]} has one run; the exact test over seeds needs two runs or more in each arm"
            if small else None)


def read_arm(name: str, runs: list[Path], data_dir: Path, part1: bool = False) -> Arm:
    if not part1:
        refuse_mixed_tasks(name, runs)
    loaded = []
    for run in runs:
        pairs = part1_predictions_and_gold(run, data_dir) if part1 else checked_predictions_and_gold(run, data_dir)
        loaded.append({task: (np.asarray(predictions, dtype=np.float64), np.asarray(gold, dtype=np.float64))
                       for task, (predictions, gold) in pairs.items()})
    return Arm(name, loaded)


def refuse_mixed_tasks(name: str, runs: list[Path]) -> None:
    """PredictionsFileError unless the arm's runs trained the same tasks: its overall score is their mean, and a run
    of other tasks kept its model on another overall score."""
    trained = {run: record.tasks if (record := run_record(run)) is not None else MULTITASK for run in runs}
    other = next((run for run in runs if trained[run] != trained[runs[0]]), None)
    if other is not None:
        raise PredictionsFileError(f"{name}: {other} trained {','.join(trained[other])}, {runs[0]} "
                                   f"{','.join(trained[runs[0]])}: an arm averages runs of the same tasks")


Tests = dict[tuple[str, str], Difference]  # (later arm, score or figure key) -> its difference from the first arm


def difference_cells(d: Difference, adjusted: float | None) -> str:
    """'difference [interval] | p | Holm p | verdict' of a secondary comparison; the primary's (adjusted None) points
    to its line above."""
    shown = f"{d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}] | {d.p:.3f}"
    if adjusted is None:
        return f"{shown} | — | primary (above) |"
    says = secondary_verdict(adjusted, d.separable)
    direction = "" if says == "not separable" else " (higher)" if d.value > 0 else " (lower)"
    return f"{shown} | {adjusted:.3f} | {says}{direction} |"


def table(comparison: Comparison, arms: list[Arm], adjusted: dict, tasks: tuple[str, ...] = MULTITASK) -> list[str]:
    shown = columns(tasks)
    lines = ["| arm | runs | " + " | ".join(title for _, title in shown) + " |",
             "|---|---|" + "---|" * len(shown)]
    for arm in arms:
        cells = [f"{e.value:.4f} [{e.low:.4f}, {e.high:.4f}]"
                 for e in (comparison.scores[arm.name][key] for key, _ in shown)]
        lines.append(f"| {arm.name} | {len(arm.runs)} | " + " | ".join(cells) + " |")
    first = arms[0].name
    for arm in arms[1:]:
        lines += ["", f"{arm.name} - {first} (paired over the same dev examples):", "",
                  "| score | difference [95% interval] | p | Holm p | |", "|---|---|---|---|---|"]
        lines += [f"| {title} | " + difference_cells(comparison.differences[arm.name][key],
                                                       adjusted.get((arm.name, key)))
                  for key, title in shown]
    if any(len(arm.runs) == 1 for arm in arms):
        lines += ["", "An arm of one run: its interval covers the dev examples only, not another seed."]
    return lines


FORGETTING = (("backward_transfer", "BWT"), ("average_forgetting", "mean forgetting"))
FIGURE_NAMES = {"backward_transfer": "bwt", "average_forgetting": "forgetting"}  # --primary's names of FORGETTING
DEV_READ = "dev_read"  # a run's figures also say what its stages were scored on (dev_read)


def forgetting_figures(runs: list[Path]) -> list[dict] | None:
    """Each run's backward transfer and mean forgetting, or None unless every run is sequential; with them, under
    DEV_READ, the dev examples its stages were scored on (dev_read). PredictionsFileError for an arm whose runs
    were not all scored on the same."""
    figures = []
    for run in runs:
        try:
            history = json.loads((run / "history.json").read_text())
            measures = history_forgetting_measures(history)
        except (OSError, ValueError):
            return None
        if measures is None:
            return None
        check_history_is_the_runs(run, history, measures)
        figures.append({**{key: getattr(measures, key) for key, _ in FORGETTING}, DEV_READ: dev_read(run, history)})
    if len({figure[DEV_READ] for figure in figures}) > 1:
        raise PredictionsFileError("an arm's runs must score their stages on the same dev examples, but "
                                   + ", ".join(f"{run} on {figure[DEV_READ]}" for run, figure in zip(runs, figures)))
    return figures


def check_history_is_the_runs(run: Path, history: list[dict], measures) -> None:
    """PredictionsFileError unless history.json holds the record of the run's kept model (another run's history would
    give this run that run's forgetting) and finite figures (a damaged record's NaN would be averaged)."""
    record = run_record(run)
    kept = record is not None and record.source.name == "best.json"  # an ensemble's folder has no history of its own
    mismatch = kept_record_mismatch(record.metrics, history) if kept else None
    if mismatch:
        raise PredictionsFileError(f"{run}/history.json: not the history of best.json's kept model ({mismatch})")
    damaged = next((name for key, name in FORGETTING if not math.isfinite(getattr(measures, key))), None)
    if damaged:
        raise PredictionsFileError(f"{run}/history.json: its {damaged} is not a finite number (a damaged record)")


def dev_read(run: Path, history: list[dict]) -> str:
    """What a sequential run's stages were scored on, which its forgetting figures measure: every dev example, or
    (--max_eval_examples N) a fixed subset of at most N dev examples a task."""
    read = {"every dev example" if record.get(SUBSET_KEY) is None else
            f"at most {record[SUBSET_KEY]} dev examples a task"
            for record in history if record.get("stage") != BEFORE_TRAINING}
    if len(read) > 1:
        raise PredictionsFileError(f"{run}/history.json: its stages were scored on different dev examples: "
                                   + " and ".join(sorted(read)))
    return read.pop()


def forgetting_tests(arms: list[tuple[str, list[dict]]]) -> Tests:
    """Each later arm's difference from the first in each figure, over the seeds (exact permutation p)."""
    baseline = arms[0][1]
    return {(name, key): seed_difference([f[key] for f in figures], [f[key] for f in baseline])
            for name, figures in arms[1:] for key, _ in FORGETTING}


def forgetting_table(arms: list[tuple[str, list[dict]]], tests: Tests, adjusted: dict) -> list[str]:
    """Each arm's mean +- std of the figures, then each later arm's difference from the first over the seeds."""
    lines = ["Forgetting over seeds (each run's own figure: bootstrap over the runs, exact permutation p):", "",
             "| arm | runs | " + " | ".join(title for _, title in FORGETTING) + " | stages scored on |",
             "|---|---|---|---|---|"]
    for name, figures in arms:
        cells = [f"{np.mean(values):+.4f} ± {np.std(values, ddof=1):.4f}"
                 for values in ([f[key] for f in figures] for key, _ in FORGETTING)]
        lines.append(f"| {name} | {len(figures)} | " + " | ".join(cells) + f" | {figures[0][DEV_READ]} |")
    if len({figures[0][DEV_READ] for _, figures in arms}) > 1:
        lines += ["", "The arms' stages were scored on different dev examples (a subset: --max_eval_examples), so "
                  "their forgetting figures measure the same quantity on different samples of dev."]
    lines += ["", f"| difference from {arms[0][0]} | score | difference [95% interval] | exact p | Holm p | |",
              "|---|---|---|---|---|---|"]
    # A bootstrap of three runs is too narrow (it never draws a value beyond them): the exact test's p decides.
    lines += [f"| {name} | {title} | " + difference_cells(tests[name, key], adjusted.get((name, key)))
              for name, _ in arms[1:] for key, title in FORGETTING]
    return lines


def primary_key(args: argparse.Namespace) -> tuple[str, str] | None:
    """--primary as (the later arm, the key of its figure), or None when not given."""
    if not args.primary:
        return None
    name, figure = parse_primary(args.primary, [name for name, _ in args.arms])
    return name, primary_figures(args.part1)[figure]


def primary_line(args: argparse.Namespace, arms: list[Arm], figures: list) -> str:
    """The declared comparison over the seeds, its exact p and verdict; PredictionsFileError when its figure is not
    every run's (bwt or forgetting of runs that are not all sequential)."""
    name, key = primary_key(args)
    base = arms[0].name
    tasks, sequential = PART1_TASKS if args.part1 else MULTITASK, dict(figures)
    values = {}
    for arm in (arm for arm in arms if arm.name in (base, name)):
        if key in FIGURE_NAMES and sequential.get(arm.name) is None:
            raise PredictionsFileError(f"--primary {args.primary}: {arm.name}'s runs are not all sequential ones "
                                       "(history.json with continual-learning figures)")
        values[arm.name] = ([f[key] for f in sequential[arm.name]] if key in FIGURE_NAMES
                            else [float(run_scores(run, tasks)[key][0]) for run in arm.runs])
    d = seed_difference(values[name], values[base])
    says = ("higher" if d.value > 0 else "lower") if d.p < ALPHA else "not separable"
    return (f"Primary comparison (declared: --primary {args.primary}; the exact permutation test over the seeds "
            f"decides at p < {ALPHA}):\n{name} - {base}, {FIGURE_NAMES.get(key, key)} ({len(values[name])} against "
            f"{len(values[base])} runs): {d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}], exact p {d.p:.3f}: {says}\n")


def family(comparison: Comparison, arms: list[Arm], tasks: tuple[str, ...], seed_tests: Tests,
           primary: tuple[str, str] | None) -> dict:
    """Every secondary comparison's Holm-adjusted p, over the family of all but the primary one."""
    tests = {(arm.name, key): comparison.differences[arm.name][key] for arm in arms[1:] for key, _ in columns(tasks)}
    tests.update(seed_tests)
    tests.pop(primary, None)
    return dict(zip(tests, holm([d.p for d in tests.values()])))


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    tasks = PART1_TASKS if args.part1 else MULTITASK
    try:
        arms = [read_arm(name, runs, Path(args.data_dir), args.part1) for name, runs in args.arms]
        figures = [] if args.part1 else [(name, forgetting_figures(runs)) for name, runs in args.arms]
        print(primary_line(args, arms, figures) if args.primary else
              "No primary comparison declared (--primary): every comparison below is secondary.\n")
    except (DataError, PredictionsFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sequential = figures and all(f is not None and len(f) >= 2 for _, f in figures)
    seed_tests = forgetting_tests(figures) if sequential else {}
    comparison = compare(arms, tasks, args.replicates, args.seed)
    adjusted = family(comparison, arms, tasks, seed_tests, primary_key(args))
    print(f"{args.replicates} bootstrap replicates (seed {args.seed}) over the dev examples of {args.data_dir}"
          + (" and over each arm's runs" if any(len(arm.runs) > 1 for arm in arms) else "")
          + f". Secondary comparisons: a family of {len(adjusted)}, Holm-corrected (Holm p); \"survives\": "
          f"Holm p < {ALPHA} and an interval without zero.\n")
    print("\n".join(table(comparison, arms, adjusted, tasks)))
    if sequential:
        print("\n" + "\n".join(forgetting_table(figures, seed_tests, adjusted)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
