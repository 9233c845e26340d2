"""The figure of RESULTS.md's front page: per seed and arm, the forgetting study's backward transfer and kept overall
dev score and the robustness study's drops, each arm's mean with a 95% interval over its seeds; it prints the same
values as markdown rows with each arm's exact permutation p against the first arm (minbert/reports/study_plots.py).

    python scripts/plot_studies.py --out docs/results/studies.png

An arm ARM is the folders ARM and ARM_seedN of a study's directory (results/cpu_forgetting/none, none_seed1, ...);
an arm with no folder in the robustness study's directory is left out of its panels.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from minbert.arguments import OneLineErrorParser
from minbert.prediction.run_evaluation import kept_record_mismatch
from minbert.reports.plots import figure_problem
from minbert.reports.study_plots import SeedPanel, plot_seed_panels, seed_panel_rows
from minbert.reports.tables import history_forgetting_measures


class StudyError(Exception):
    """A run folder that does not hold what the figure reads: one line naming the file."""


def parse_rows(text: str) -> list[tuple[str, str]]:
    rows = [tuple(item.split(":", 1)) for item in text.split(",") if item]
    if not rows or any(len(row) != 2 or not all(row) for row in rows):
        raise argparse.ArgumentTypeError(f"{text!r}: expected TASK:VARIANT[,TASK:VARIANT...], e.g. sts:eps=0.01")
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="the PNG to write")
    parser.add_argument("--forgetting_dir", type=Path, default=Path("results/cpu_forgetting"))
    parser.add_argument("--robustness_dir", type=Path, default=Path("results/robustness_study"))
    parser.add_argument("--arms", default="none,thesis_smart,bregman,ewc_1e6,lnsr",
                        help="comma-separated arm names; the first is the baseline")
    parser.add_argument("--robustness_rows", type=parse_rows, default=parse_rows("sts:eps=0.01,sts:eps=0.03"),
                        help="the robustness suite's rows to draw, TASK:VARIANT as robustness.json names them")
    args = parser.parse_args(argv)
    args.arms = [arm for arm in args.arms.split(",") if arm]
    for directory in (args.forgetting_dir, args.robustness_dir):
        if not directory.is_dir():
            parser.error(f"{directory}: not a directory")
    if not args.arms:
        parser.error("--arms: no arm named")
    if args.out.suffix != ".png":
        parser.error(f"--out {args.out}: expected a .png path")
    return args


def arm_runs(directory: Path, arm: str) -> list[Path]:
    """ARM's folder and its ARM_seedN folders, by seed."""
    seeds = [path for path in directory.glob(f"{arm}_seed*") if re.fullmatch(rf"{re.escape(arm)}_seed\d+", path.name)]
    seeds.sort(key=lambda path: int(path.name.rsplit("seed", 1)[1]))
    return [path for path in [directory / arm, *seeds] if path.is_dir()]


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise StudyError(f"{path}: cannot be read as JSON ({error.__class__.__name__})") from error


def forgetting_figures(run: Path) -> tuple[float, float]:
    """A run's backward transfer (from its history) and its kept model's overall dev score (best.json)."""
    history = read_json(run / "history.json")
    measures = history_forgetting_measures(history)
    metrics = read_json(run / "best.json").get("metrics", {})
    kept = metrics.get("overall")
    if measures is None or kept is None:
        raise StudyError(f"{run}: not a sequential run with a kept model (history.json, best.json)")
    mismatch = kept_record_mismatch(metrics, history)  # another run's history would draw that run's figure here
    if mismatch:
        raise StudyError(f"{run}/history.json: not the history of best.json's kept model ({mismatch})")
    if not all(math.isfinite(value) for value in (measures.backward_transfer, kept)):
        raise StudyError(f"{run}: its backward transfer or kept overall score is not a finite number (a damaged "
                         "record)")
    return measures.backward_transfer, kept


def robustness_drop(run: Path, task: str, variant: str) -> float:
    rows = read_json(run / "robustness.json").get("rows", [])
    drops = [row["drop"]["value"] for row in rows if row.get("task") == task and row.get("variant") == variant]
    if len(drops) != 1:
        raise StudyError(f"{run / 'robustness.json'}: no row {task}:{variant}")
    return drops[0]


def study_panels(args: argparse.Namespace) -> list[SeedPanel]:
    forgetting = {arm: [forgetting_figures(run) for run in arm_runs(args.forgetting_dir, arm)] for arm in args.arms}
    robust = {arm: arm_runs(args.robustness_dir, arm) for arm in args.arms}
    robust = {arm: runs for arm, runs in robust.items() if runs}
    for study, arms in (("forgetting", forgetting), ("robustness", robust)):
        few = [arm for arm, runs in arms.items() if len(runs) < 2]
        if few:
            raise StudyError(f"arm {few[0]}: fewer than two runs (seeds) in the {study} study's directory")
    panels = [SeedPanel("backward transfer (forgetting study)", {a: [f[0] for f in v] for a, v in forgetting.items()}),
              SeedPanel("kept model's overall dev (forgetting study)",
                        {a: [f[1] for f in v] for a, v in forgetting.items()})]
    for task, variant in args.robustness_rows:
        panels.append(SeedPanel(f"{task.upper()} drop, {variant} (robustness study)",
                                {arm: [robustness_drop(run, task, variant) for run in runs]
                                 for arm, runs in robust.items()}))
    return panels


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = figure_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        panels = study_panels(args)
    except StudyError as error:
        print(error, file=sys.stderr)
        return 2
    for panel in panels:
        print("\n".join(seed_panel_rows(panel, baseline=args.arms[0])) + "\n")
    print(plot_seed_panels(panels, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
