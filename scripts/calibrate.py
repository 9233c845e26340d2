"""Calibrate finished runs from the dev scores they saved (RUN/scores/), as a run does at its end: for each calibrated
task (SST, QQP) the dev expected calibration error before and after temperature scaling, the temperature fitted on
dev, and for QQP the decision threshold chosen on dev with the dev accuracy at probability 0.5 and at it
(minbert/reports/calibration.py; the figures fitted and scored on the same dev set are optimistic, the 2-fold
cross-fitted ones are not).

    python scripts/calibrate.py results/cpu_best --data_dir ../shared/data/protocol
    python scripts/calibrate.py runs/demo --data_dir data/demo --threshold_out runs/demo/thresholded

Each RUN gets calibration.json (what predict.py --calibrated / --threshold and scripts/ensemble.py --calibrated read)
and a reliability diagram per task (TASK_reliability.png). --data_dir holds the course files, for the dev labels.
--threshold_out DIR (one run) also writes the dev and test leaderboard CSVs of each task with a threshold, decided
from the run's scores at the threshold chosen on dev; the run's own CSVs are left as they are (a DIR where one of
them would be written over is refused, as is one inside another run's folder: docs/runs.md). A run's dev scores must
be its own: decided as the run decided its CSVs they score the dev metric its best.json records, else (a scores file
copied from another run) the run is refused in one line naming the file, before anything is written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minbert.arguments import OneLineErrorParser
from minbert.data.batches import DataError, show_data_warnings_on_one_line
from minbert.data.scores import ScoresFileError, read_scores, scores_path
from minbert.files import describe_os_error, forbidden_output, unwritable_folder
from minbert.prediction.ensemble_scores import dev_labels
from minbert.reports.calibration import calibration_lines, write_calibration
from minbert.run.run_outputs import check_run_dev, damaged_record, leaderboard_files
from minbert.tasks import RUN_TASKS, TASKS, default_output
from minbert.tasks.base import decided

CALIBRATED = tuple(name for name in RUN_TASKS if TASKS[name].calibrated)


def run_dev(run: Path, data_dir: str) -> dict:
    """task -> (dev scores as saved, gold labels) of each calibrated task the run saved dev scores of."""
    scores = {task: read_scores(scores_path(run, task, "dev"), task) for task in CALIBRATED
              if scores_path(run, task, "dev").is_file()}
    if not scores:
        raise ScoresFileError(f"{run / 'scores'}: no dev scores of a calibrated task ({', '.join(CALIBRATED)}); a "
                              "run writes them when it finishes")
    gold = dev_labels(data_dir, {task: ids for task, (ids, _) in scores.items()})
    return {task: (values, gold[task]) for task, (_, values) in scores.items()}


def thresholded_path(output_dir: Path, task: str, split: str) -> Path:
    return output_dir / Path(default_output(task, split)).name


def replaced_by_thresholded(run: Path, output_dir: Path) -> str | None:
    """Why --threshold_out OUTPUT_DIR must not be written, or None: a CSV it would hold is one of the run's own."""
    own = leaderboard_files(run)
    return next(filter(None, (forbidden_output("--threshold_out", thresholded_path(output_dir, task, split), own, [run])
                              for task in CALIBRATED for split in ("dev", "test"))), None)


def write_thresholded(run: Path, report: dict, output_dir: Path) -> list[Path]:
    """The dev and test leaderboard CSVs of each task of the report with a threshold, decided from the run's scores
    at it."""
    written = []
    for name, entry in report["tasks"].items():
        if "threshold" not in entry:
            continue
        for split in ("dev", "test"):
            ids, scores = read_scores(scores_path(run, name, split), name)
            path = thresholded_path(output_dir, name, split)
            TASKS[name].outputs.write_predictions(path, ids, decided(TASKS[name], scores, entry["threshold"]["logit"])[1])
            written.append(path)
    return written


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="finished runs' output folders (each with scores/)")
    parser.add_argument("--data_dir", default="data", help="the course files, for the dev labels")
    parser.add_argument("--threshold_out", help="also write the thresholded tasks' CSVs here (one run)")
    args = parser.parse_args(argv)
    if args.threshold_out and len(args.runs) > 1:
        parser.error("--threshold_out takes one run")
    show_data_warnings_on_one_line()
    problem = next((f"{run}: not a run's folder" for run in args.runs if not Path(run).is_dir()), None)
    # A damaged best.json is no record: the run's CSVs it sent elsewhere would lose --threshold_out's guard.
    problem = problem or next(filter(None, (damaged_record(Path(run)) for run in args.runs)), None)
    if args.threshold_out:
        problem = (problem or unwritable_folder(Path(args.threshold_out))
                   or replaced_by_thresholded(Path(args.runs[0]), Path(args.threshold_out)))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        dev = {run: run_dev(run, args.data_dir) for run in map(Path, args.runs)}
        for run, scores in dev.items():  # every run's scores its own before anything is written
            check_run_dev(run, scores)
        for run, scores in dev.items():
            report = write_calibration(run, scores)
            print(f"{run}:\n" + "\n".join(f"  {line}" for line in calibration_lines(report)))
            if args.threshold_out:
                for path in write_thresholded(run, report, Path(args.threshold_out)):
                    print(f"wrote {path}")
    except (ScoresFileError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
