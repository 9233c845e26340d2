"""Is one configuration more robust than another, and at what clean-score cost? The robustness suite's output of
several runs (seeds) per configuration compared on every row: each arm's drop (clean - perturbed) and each later
arm's drop minus the first arm's, with hierarchical bootstrap 95% intervals (docs/robustness_suite.md, "Comparing
configurations"; minbert/reports/robustness_comparison.py says how).

    python scripts/compare_robustness.py none=runs/a/robustness,runs/b/robustness smart=runs/c/robustness,... \\
        --output results/robustness_study.md

An arm is NAME=DIR[,DIR...]: scripts/robustness.py's output folders (a run's folder stands for RUN/robustness);
the first arm is the baseline. Every run must have been scored on the same inputs (the same --perturbed_dir and
attack settings), an arm names each run once and no two arms the same runs. A folder's predictions must be numbers
its tasks take and those its robustness.json scored; a folder inside a run's folder must hold that run's results (the
checkpoint's SHA-256 it records). Prints the markdown tables; --output FILE.md writes them and FILE.json, every
estimate.

--primary [ARM:]TASK/FAMILY/VARIANT (e.g. smart:sts/embedding/eps=0.01) declares the study's one primary comparison
before its tables: that row's drop of ARM's runs (the second arm when not named) against the first arm's, decided
by the exact permutation test over the seeds (each run's own drop) at p < 0.05; printed first. Every other difference
(drops and clean scores) is secondary: a family whose p values are Holm-corrected (minbert/reports/decisions.py),
each shown with its raw p, its adjusted p and "survives" or "not separable". Without --primary every comparison is
secondary.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minbert.arguments import OneLineErrorParser, rng_seed
from minbert.files import (DataError, OutputError, atomic_write_text, forbidden_output, read_input_text,
                           repeated_arm, repeated_run, run_folder_of, unwritable_folder)
from minbert.reports.bootstrap import Difference, Estimate, arms_problem
from minbert.reports.decisions import ALPHA, holm, parse_primary, secondary_verdict
from minbert.reports.robustness_comparison import (PREDICTIONS, CleanResult, RobustnessComparison, ScoredRun,
                                                   compare_arms, mismatch, scored_run, seed_test, variant_problem)
from minbert.run.kept_ensemble import checkpoint_json
from minbert.tasks import TASKS

REPORT = "robustness.json"


def parse_arm(text: str) -> tuple[str, list[Path]]:
    name, _, folders = text.partition("=")
    dirs = [Path(folder) for folder in folders.split(",") if folder]
    if not name or not dirs:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR[,DIR...]")
    dirs = [folder / "robustness" if not (folder / REPORT).exists() and (folder / "robustness").is_dir()
            else folder for folder in dirs]
    problem = repeated_run(dirs)
    if problem:
        raise argparse.ArgumentTypeError(f"{name}: {problem}")
    return name, dirs


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", type=parse_arm, help="NAME=DIR[,DIR...]; the first is the baseline")
    parser.add_argument("--replicates", type=int, default=2000, help="bootstrap replicates of each interval")
    parser.add_argument("--seed", type=rng_seed, default=0, help="of the bootstrap")
    parser.add_argument("--output", type=Path, help="FILE.md: the tables there, every estimate in FILE.json")
    parser.add_argument("--primary", metavar="[ARM:]TASK/FAMILY/VARIANT",
                        help="the comparison that decides, over the seeds: that row's drop of ARM (the second arm "
                             "by default) against the first arm; every other one is secondary")
    args = parser.parse_args(argv)
    problem = arms_problem([name for name, _ in args.arms], args.replicates) or repeated_arm(args.arms) or (
        primary_problem(args.primary, dict(args.arms)) if args.primary else None)
    if problem:
        parser.error(problem)
    if args.output is not None and args.output.suffix != ".md":  # FILE.json beside it holds the estimates
        parser.error(f"--output: {args.output} is not a .md file; name FILE.md (every estimate goes to FILE.json)")
    return args


def primary_row(text: str, arms: list[str]) -> tuple[str, tuple[str, str, str]]:
    """--primary as (ARM, (TASK, FAMILY, VARIANT)); ValueError saying what is wrong."""
    arm, figure = parse_primary(text, arms)
    row = tuple(figure.split("/", 2))
    if len(row) != 3 or not all(row):
        raise ValueError(f"--primary: {figure!r} is not TASK/FAMILY/VARIANT (e.g. sts/embedding/eps=0.01)")
    return arm, row


def primary_problem(text: str, arms: dict[str, list[Path]]) -> str | None:
    """What makes --primary impossible before anything is read, in one line, or None."""
    try:
        arm, _ = primary_row(text, list(arms))
    except ValueError as err:
        return str(err)
    small = [name for name in (next(iter(arms)), arm) if len(arms[name]) < 2]
    return (f"--primary: {small[0]} has one run; the exact test over seeds needs two runs or more in each arm"
            if small else None)


def missing_primary_row(text: str, arms: dict[str, list[ScoredRun]]) -> str | None:
    """Why the runs (scored on the same inputs: the first one's rows are every run's) lack --primary's row, or None."""
    _, row = primary_row(text, list(arms))
    return variant_problem(next(iter(arms.values()))[0], *row)


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
        scored = scored_run(str(folder), found[PREDICTIONS], found[REPORT])
    except ValueError as err:
        raise DataError(folder, str(err)) from None
    check_own_run(folder, found[REPORT]["settings"])
    return scored


def check_own_run(folder: Path, settings: dict) -> None:
    """Results inside a run's folder are that run's (robustness.py writes none of another run's there, an ensemble's
    only in a member's): one checkpoint they record scoring (each one's weights' SHA-256) is the run's checkpoint of
    that name, else a DataError naming robustness.json. Results scored before the suite recorded the SHA-256 are
    checked against their predictions alone (scored_run)."""
    run = run_folder_of(folder)
    digests = settings.get("checkpoints_sha256", [settings.get("checkpoint_sha256")])
    if run is None or digests == [None]:
        return
    prefixes = settings.get("checkpoints", [settings.get("checkpoint")])
    if not (isinstance(digests, list) and isinstance(prefixes, list) and len(digests) == len(prefixes)):
        raise DataError(folder / REPORT, "its checkpoints and their SHA-256 are not as the suite writes them")
    scored = [(Path(str(prefix)).name, digest) for prefix, digest in zip(prefixes, digests)]
    if not any(checkpoint_json(run / name).get("sha256") == digest for name, digest in scored):
        raise DataError(folder / REPORT, f"scored {', '.join(map(str, prefixes))}, not the run {run} it lies in "
                                         f"(its {scored[0][0]}.json holds other weights, or none): another run's "
                                         "results, or this run's before it was trained again; score it again")


def interval(value: Estimate, sign: str = "+") -> str:
    return f"{value.value:{sign}.3f} [{value.low:{sign}.3f}, {value.high:{sign}.3f}]"


Adjusted = dict[tuple, float]  # (arm, task, family, variant or "clean") -> its Holm-adjusted p


def verdict(difference: Difference, adjusted: float | None, lower: str, higher: str) -> str:
    """The difference [interval], its p and Holm-adjusted p, and what it says: "survives" (lower or higher) when the
    adjusted p is below ALPHA and the interval holds no zero, else "not separable"; the primary's (adjusted None)
    points to its line above."""
    if adjusted is None:
        return f"{interval(difference)}, p {difference.p:.3f}, primary (above)"
    says = secondary_verdict(adjusted, difference.separable)
    if says != "not separable":
        says += f" ({lower if difference.value < 0 else higher})"
    return f"{interval(difference)}, p {difference.p:.3f}, Holm p {adjusted:.3f}, {says}"


def title(task: str) -> str:
    return f"{TASKS[task].title} {TASKS[task].model.score_key.split('_')[-1]}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|---" * len(head) + "|", *("| " + " | ".join(row) + " |" for row in rows)]


def shown_clean(result: RobustnessComparison) -> list[tuple[CleanResult, list[str]]]:
    """The clean rows as shown: a task's families scored on the same examples with the same predictions share one
    (and count once in the family of secondary comparisons)."""
    shown: list = []
    for row in result.clean:
        if shown and (shown[-1][0].task, shown[-1][0].clean, shown[-1][0].minus_baseline) == (
                row.task, row.clean, row.minus_baseline):
            shown[-1][1].append(row.family)
        else:
            shown.append((row, [row.family]))
    return shown


def secondary_family(result: RobustnessComparison, primary: tuple | None) -> Adjusted:
    """Every difference shown but the primary one, with its Holm-adjusted p over them all."""
    tests = {(arm, row.task, row.family, row.variant): d for row in result.variants
             for arm, d in row.minus_baseline.items()}
    tests.update({(arm, row.task, row.family, "clean"): d for row, _ in shown_clean(result)
                  for arm, d in row.minus_baseline.items()})
    tests.pop(primary, None)
    return dict(zip(tests, holm([d.p for d in tests.values()])))


def primary_lines(result: RobustnessComparison, text: str) -> list[str]:
    """The declared comparison over the seeds, its exact p and verdict."""
    arm, (task, family, variant) = primary_row(text, list(result.arms))
    d, base = seed_test(result, arm, task, family, variant), next(iter(result.arms))
    says = ("smaller drop" if d.value < 0 else "larger drop") if d.p < ALPHA else "not separable"
    return [f"Primary comparison (declared: --primary {text}; the exact permutation test over the seeds decides at "
            f"p < {ALPHA}): {arm} - {base}, the drop on {task}/{family}/{variant} ({len(result.arms[arm])} against "
            f"{len(result.arms[base])} runs): {interval(d)}, exact p {d.p:.3f}, {says}.", ""]


def markdown(result: RobustnessComparison, primary: str | None = None) -> list[str]:
    """The primary comparison when declared, then the drops, the clean scores and the greedy attack's success, each
    a table with a line per row."""
    names, base = list(result.arms), next(iter(result.arms))
    later = names[1:]
    arm, row = primary_row(primary, names) if primary else (None, ())
    adjusted = secondary_family(result, (arm, *row) if primary else None)
    lines = [f"# Robustness of {', '.join(names)} (baseline: {base})", "",
             *(primary_lines(result, primary) if primary else
               ["No primary comparison declared (--primary): every comparison below is secondary.", ""]),
             "Runs: " + "; ".join(f"{name}: {', '.join(runs)}" for name, runs in result.arms.items()) + ".",
             f"Drop = clean - perturbed, the mean over an arm's runs; 95% intervals from {result.replicates} "
             f"replicates of a hierarchical bootstrap (seed {result.seed}): examples drawn once, shared by every arm "
             "(paired), runs drawn within each arm. An arm of one run: its interval covers the examples alone.",
             f"ARM - {base} < 0: a smaller drop than {base}'s (more robust). Secondary comparisons: a family of "
             f"{len(adjusted)}, Holm-corrected; \"survives\": Holm p < {ALPHA} and an interval without 0, else "
             "\"not separable\".", "", "## Drops", ""]
    lines += table(["task", "family", "variant", "n", *(f"{name} drop" for name in names),
                    *(f"{name} - {base}" for name in later)],
                   [[title(row.task), row.family, row.variant, str(row.examples),
                     *(interval(row.drop[name]) for name in names),
                     *(verdict(row.minus_baseline[name], adjusted.get((name, row.task, row.family, row.variant)),
                               "smaller drop", "larger drop") for name in later)]
                    for row in result.variants])
    lines += ["", "## Clean scores (the clean-score cost)", ""]
    lines += table(["task", "families", "n", *names, *(f"{name} - {base}" for name in later)],
                   [[title(row.task), ", ".join(families), str(row.examples),
                     *(interval(row.clean[name], "") for name in names),
                     *(verdict(row.minus_baseline[name], adjusted[name, row.task, row.family, "clean"], "lower",
                               "higher") for name in later)]
                    for row, families in shown_clean(result)])
    return lines + greedy_lines(result) + [""]


def greedy_lines(result: RobustnessComparison) -> list[str]:
    if not result.greedy:
        return []
    names = list(result.arms)
    return ["", "## The greedy attack: success rate (mean over the runs), words changed per success", "",
            *table(["task", "variant", *names],
                   [[title(row.task), row.variant,
                     *(f"{row.success_rate[name]:.3f}, " + (f"{row.words_per_success[name]:.2f} words"
                                                             if row.success_rate[name] else "no success")
                       for name in names)] for row in result.greedy])]


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        read = [folder for _, folders in args.arms for folder in folders]
        written = (args.output, args.output.with_suffix(".json"))
        problem = unwritable_folder(args.output.parent) or next(
            filter(None, (forbidden_output("--output", path, read) for path in written)), None)
        if problem:
            raise OutputError(problem)
    arms = {name: [read_run(folder) for folder in folders] for name, folders in args.arms}
    problem = mismatch([run for runs in arms.values() for run in runs]) or (
        missing_primary_row(args.primary, arms) if args.primary else None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    result = compare_arms(arms, args.replicates, args.seed)
    text = "\n".join(markdown(result, args.primary))
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
