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
two runs or more in every arm.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from evaluation import PredictionsFileError
from minbert.arguments import OneLineErrorParser
from minbert.data.batches import DataError, show_data_warnings_on_one_line
from minbert.reports.bootstrap import OVERALL, Arm, Comparison, arms_problem, compare
from minbert.reports.seed_tests import seed_difference
from minbert.reports.tables import history_forgetting_measures
from minbert.run.run_outputs import part1_predictions_and_gold, predictions_and_gold
from minbert.tasks import MULTITASK, PART1_TASKS, TASKS


def columns(tasks: tuple[str, ...]) -> list[tuple[str, str]]:
    """The table's (key, title) columns: each task's score, and the overall score for the course's three tasks."""
    scores = [(task, f"{TASKS[task].title} {TASKS[task].score_key.split('_')[-1]}") for task in tasks]
    return scores + ([(OVERALL, "overall")] if tuple(tasks) == MULTITASK else [])


def parse_arm(text: str) -> tuple[str, list[Path]]:
    name, _, runs = text.rpartition("=") if "=" in text else (Path(text).name, "", text)
    folders = [Path(run) for run in runs.split(",") if run]
    if not name or not folders:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=RUN[,RUN...] or a run's folder")
    missing = [str(folder) for folder in folders if not folder.is_dir()]
    if missing:
        raise argparse.ArgumentTypeError(f"{missing[0]}: not a run's folder")
    return name, folders


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", type=parse_arm, help="NAME=RUN[,RUN...] or RUN; the first is the baseline")
    parser.add_argument("--data_dir", required=True, help="the course's dev files the runs predicted")
    parser.add_argument("--replicates", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--part1", action="store_true", help="the runs are classifier.py's (SST, CFIMDB)")
    args = parser.parse_args(argv)
    problem = arms_problem([name for name, _ in args.arms], args.replicates)
    if problem:
        parser.error(problem)
    return args


def read_arm(name: str, runs: list[Path], data_dir: Path, part1: bool = False) -> Arm:
    loaded = []
    for run in runs:
        pairs = part1_predictions_and_gold(run, data_dir) if part1 else predictions_and_gold(run, data_dir)
        loaded.append({task: (np.asarray(predictions, dtype=np.float64), np.asarray(gold, dtype=np.float64))
                       for task, (predictions, gold) in pairs.items()})
    return Arm(name, loaded)


def table(comparison: Comparison, arms: list[Arm], tasks: tuple[str, ...] = MULTITASK) -> list[str]:
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
                  "| score | difference [95% interval] | p | |", "|---|---|---|---|"]
        for key, title in shown:
            d = comparison.differences[arm.name][key]
            verdict = ("higher" if d.value > 0 else "lower") if d.separable else "not separable"
            lines.append(f"| {title} | {d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}] | {d.p:.3f} | {verdict} |")
    if any(len(arm.runs) == 1 for arm in arms):
        lines += ["", "An arm of one run: its interval covers the dev examples only, not another seed."]
    return lines


FORGETTING = (("backward_transfer", "BWT"), ("average_forgetting", "mean forgetting"))


def forgetting_figures(runs: list[Path]) -> list[dict] | None:
    """Each run's backward transfer and mean forgetting, or None unless every run is sequential."""
    figures = []
    for run in runs:
        try:
            measures = history_forgetting_measures(json.loads((run / "history.json").read_text()))
        except (OSError, ValueError):
            return None
        if measures is None:
            return None
        figures.append({key: getattr(measures, key) for key, _ in FORGETTING})
    return figures


def forgetting_table(arms: list[tuple[str, list[dict]]]) -> list[str]:
    """Each arm's mean +- std of the figures, then each later arm's difference from the first over the seeds."""
    lines = ["Forgetting over seeds (each run's own figure: bootstrap over the runs, exact permutation p):", "",
             "| arm | runs | " + " | ".join(title for _, title in FORGETTING) + " |", "|---|---|---|---|"]
    for name, figures in arms:
        cells = [f"{np.mean(values):+.4f} ± {np.std(values, ddof=1):.4f}"
                 for values in ([f[key] for f in figures] for key, _ in FORGETTING)]
        lines.append(f"| {name} | {len(figures)} | " + " | ".join(cells) + " |")
    first, baseline = arms[0]
    lines += ["", f"| difference from {first} | score | difference [95% interval] | p | |", "|---|---|---|---|---|"]
    for name, figures in arms[1:]:
        for key, title in FORGETTING:
            d = seed_difference([f[key] for f in figures], [f[key] for f in baseline])
            # A bootstrap of three runs is too narrow (it never draws a value beyond them): the exact test decides.
            verdict = ("higher" if d.value > 0 else "lower") if d.separable and d.p < 0.05 else "not separable"
            lines.append(f"| {name} | {title} | {d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}] | {d.p:.3f} | "
                         f"{verdict} |")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    tasks = PART1_TASKS if args.part1 else MULTITASK
    try:
        arms = [read_arm(name, runs, Path(args.data_dir), args.part1) for name, runs in args.arms]
    except (DataError, PredictionsFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    comparison = compare(arms, tasks, args.replicates, args.seed)
    print(f"{args.replicates} bootstrap replicates (seed {args.seed}) over the dev examples of {args.data_dir}"
          + (" and over each arm's runs" if any(len(arm.runs) > 1 for arm in arms) else "") + "\n")
    print("\n".join(table(comparison, arms, tasks)))
    figures = [] if args.part1 else [(name, forgetting_figures(runs)) for name, runs in args.arms]
    if figures and all(f is not None and len(f) >= 2 for _, f in figures):
        print("\n" + "\n".join(forgetting_table(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
