"""Is one configuration more robust than another, and at what clean-score cost? The robustness suite's output of
several runs (seeds) per configuration compared on every row: each arm's drop (clean - perturbed) and each later
arm's drop minus the first arm's, with hierarchical bootstrap 95% intervals (docs/robustness_suite.md, "Comparing
configurations"; minbert/reports/robustness_comparison.py says how).

    python scripts/compare_robustness.py none=runs/a/robustness,runs/b/robustness smart=runs/c/robustness,... \\
        --output results/robustness_study.md

An arm is NAME=DIR[,DIR...]: scripts/robustness.py's output folders (a run's folder stands for RUN/robustness);
the first arm is the baseline. Every run must have been scored on the same inputs (the same --perturbed_dir and
attack settings). Prints the markdown tables; --output FILE.md writes them and FILE.json, every estimate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minbert.arguments import OneLineErrorParser
from minbert.files import (DataError, OutputError, atomic_write_text, forbidden_output, read_input_text,
                           unwritable_folder)
from minbert.reports.bootstrap import Difference, Estimate, arms_problem
from minbert.reports.robustness_comparison import RobustnessComparison, ScoredRun, compare_arms, mismatch, scored_run
from minbert.tasks import TASKS

PREDICTIONS, REPORT = "robustness_predictions.json", "robustness.json"


def parse_arm(text: str) -> tuple[str, list[Path]]:
    name, _, folders = text.partition("=")
    dirs = [Path(folder) for folder in folders.split(",") if folder]
    if not name or not dirs:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR[,DIR...]")
    return name, [folder / "robustness" if not (folder / REPORT).exists() and (folder / "robustness").is_dir()
                  else folder for folder in dirs]


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", type=parse_arm, help="NAME=DIR[,DIR...]; the first is the baseline")
    parser.add_argument("--replicates", type=int, default=2000, help="bootstrap replicates of each interval")
    parser.add_argument("--seed", type=int, default=0, help="of the bootstrap")
    parser.add_argument("--output", type=Path, help="FILE.md: the tables there, every estimate in FILE.json")
    args = parser.parse_args(argv)
    problem = arms_problem([name for name, _ in args.arms], args.replicates)
    if problem:
        parser.error(problem)
    if args.output is not None and args.output.suffix == ".json":
        parser.error(f"--output: {args.output} would be overwritten by the JSON; name a .md file")
    return args


def read_run(folder: Path) -> ScoredRun:
    """A folder's two files, checked; DataError naming the file."""
    if (folder / REPORT).is_file() and not (folder / PREDICTIONS).exists():
        raise DataError(folder / PREDICTIONS, "file not found (scored before the suite kept its predictions: run "
                        "scripts/robustness.py again)")
    found = {}
    for file in (PREDICTIONS, REPORT):
        try:
            found[file] = json.loads(read_input_text(folder / file))
        except json.JSONDecodeError as err:
            raise DataError(folder / file, f"not JSON ({err.msg})", err.lineno) from None
    try:
        return scored_run(str(folder), found[PREDICTIONS], found[REPORT])
    except ValueError as err:
        raise DataError(folder, str(err)) from None


def interval(value: Estimate, sign: str = "+") -> str:
    return f"{value.value:{sign}.3f} [{value.low:{sign}.3f}, {value.high:{sign}.3f}]"


def verdict(difference: Difference, lower: str, higher: str) -> str:
    """The difference [interval], its p, and what it says ("not separable" when the interval holds zero)."""
    says = "not separable" if not difference.separable else lower if difference.value < 0 else higher
    return f"{interval(difference)}, p {difference.p:.3f}, {says}"


def title(task: str) -> str:
    return f"{TASKS[task].title} {TASKS[task].score_key.split('_')[-1]}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|---" * len(head) + "|", *("| " + " | ".join(row) + " |" for row in rows)]


def markdown(result: RobustnessComparison) -> list[str]:
    """The drops, the clean scores and the greedy attack's success, each a table with a line per row."""
    names, base = list(result.arms), next(iter(result.arms))
    later = names[1:]
    lines = [f"# Robustness of {', '.join(names)} (baseline: {base})", "",
             "Runs: " + "; ".join(f"{name}: {', '.join(runs)}" for name, runs in result.arms.items()) + ".",
             f"Drop = clean - perturbed, the mean over an arm's runs; 95% intervals from {result.replicates} "
             f"replicates of a hierarchical bootstrap (seed {result.seed}): examples drawn once, shared by every arm "
             "(paired), runs drawn within each arm. An arm of one run: its interval covers the examples alone.",
             f"ARM - {base} < 0: a smaller drop than {base}'s (more robust); \"not separable\": the interval holds 0.",
             "", "## Drops", ""]
    lines += table(["task", "family", "variant", "n", *(f"{name} drop" for name in names),
                    *(f"{name} - {base}" for name in later)],
                   [[title(row.task), row.family, row.variant, str(row.examples),
                     *(interval(row.drop[name]) for name in names),
                     *(verdict(row.minus_baseline[name], "smaller drop", "larger drop") for name in later)]
                    for row in result.variants])
    shown: list = []  # a task's families scored on the same examples with the same predictions share a line
    for row in result.clean:
        if shown and (shown[-1][0].task, shown[-1][0].clean, shown[-1][0].minus_baseline) == (
                row.task, row.clean, row.minus_baseline):
            shown[-1][1].append(row.family)
        else:
            shown.append((row, [row.family]))
    lines += ["", "## Clean scores (the clean-score cost)", ""]
    lines += table(["task", "families", "n", *names, *(f"{name} - {base}" for name in later)],
                   [[title(row.task), ", ".join(families), str(row.examples),
                     *(interval(row.clean[name], "") for name in names),
                     *(verdict(row.minus_baseline[name], "lower", "higher") for name in later)]
                    for row, families in shown])
    if result.greedy:
        lines += ["", "## The greedy attack: success rate (mean over the runs), words changed per success", ""]
        lines += table(["task", "variant", *names],
                       [[title(row.task), row.variant,
                         *(f"{row.success_rate[name]:.3f}, " + (f"{row.words_per_success[name]:.2f} words"
                                                                 if row.success_rate[name] else "no success")
                           for name in names)] for row in result.greedy])
    return lines + [""]


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        read = [folder for _, folders in args.arms for folder in folders]
        written = (args.output, args.output.with_suffix(".json"))
        problem = unwritable_folder(args.output.parent) or next(
            filter(None, (forbidden_output("--output", path, read) for path in written)), None)
        if problem:
            raise OutputError(problem)
    arms = {name: [read_run(folder) for folder in folders] for name, folders in args.arms}
    problem = mismatch([run for runs in arms.values() for run in runs])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    result = compare_arms(arms, args.replicates, args.seed)
    text = "\n".join(markdown(result))
    if args.output is not None:
        atomic_write_text(args.output, text)
        atomic_write_text(args.output.with_suffix(".json"), json.dumps(result.as_json(), indent=1) + "\n")
    print(text, end="")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (DataError, OutputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
