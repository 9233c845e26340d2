"""Error analysis of a run from its dev CSVs: prints the counts RESULTS.md quotes and redraws the three plots
(sst_error_histogram.png, qqp_confusion_matrix.png, sts_scatter.png) into the run's folder.

    python scripts/error_analysis.py results/cpu_best --data_dir ../shared/data/protocol

The dev CSVs are those the run wrote where its flags sent them (its best.json records them, a relative path against
the folder the run was started in, wherever this runs from: a run told --sst_dev_out predictions/sst-dev-out.csv, as
runs were by default before, wrote them there, not in its folder), else the three files (sst-dev-out.csv,
para-dev-out.csv, sts-dev-out.csv) in the folder's predictions/ or directly in it, as the recipes' and
scripts/ensemble.py's folders hold them; every dev example needs exactly one prediction, and each CSV must score
what the run's best.json records (another run's CSVs written over them at shared paths are refused, as
compare_runs.py refuses them). --data_dir defaults to the run's own. --output_dir in another run's folder is refused (its plots are that run's: docs/runs.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evaluation import PredictionsFileError, error_counts
from minbert.arguments import OneLineErrorParser
from minbert.data.batches import DataError, show_data_warnings_on_one_line
from minbert.files import forbidden_output, locked_folder, unwritable_folder
from minbert.reports.plots import figure_problem, plot_error_analysis
from minbert.run.run_outputs import checked_predictions_and_gold, damaged_record, run_settings
from minbert.run.run_record import recorded_path, working_dir_of
from minbert.tasks import MULTITASK


def report(counts: dict) -> list[str]:
    offsets = counts["sst_offsets"]
    wrong_by = {k: offsets[k] + offsets[-k] for k in range(1, 5)}
    qqp = counts["qqp"]
    lines = [
        f"SST (predicted - gold class): {offsets[0]} right, " + ", ".join(
            f"{wrong_by[k]} off by {k} ({offsets[k]} too positive, {offsets[-k]} too negative)" for k in range(1, 5)),
        f"QQP: {qqp['true_negatives']} true negatives, {qqp['false_positives']} false positives, "
        f"{qqp['false_negatives']} false negatives, {qqp['true_positives']} true positives; "
        f"precision {qqp['precision']:.3f}, recall {qqp['recall']:.3f}",
        f"STS: mean prediction {counts['sts_mean_prediction']:.2f}, gold mean {counts['sts_mean_gold']:.2f}",
    ]
    lines += [f"  gold {b['gold']}: {b['pairs']} pairs, mean prediction {b['mean_prediction']:.2f}, "
              f"mean absolute error {b['mean_abs_error']:.2f}" for b in counts["sts_bins"]]
    return lines


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder (or any folder) holding the three dev CSVs")
    parser.add_argument("--data_dir", type=Path, help="the course files, for the dev labels (default: the run's "
                        "own --data_dir, else data)")
    parser.add_argument("--output_dir", type=Path, help="where the plots go (default: the run folder)")
    args = parser.parse_args(argv)
    show_data_warnings_on_one_line()
    output_dir = args.output_dir or args.run
    # The run first: a missing folder or a damaged best.json would otherwise surface as a dev file not found (the
    # default --data_dir) or, its record unread, as the folder's stale CSVs analysed as the run's.
    problem = (None if args.run.is_dir() else f"{args.run}: no such run folder") or damaged_record(args.run)
    problem = (problem or unwritable_folder(output_dir)
               or forbidden_output("--output_dir", output_dir, own_runs=[args.run]) or figure_problem())
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    settings = run_settings(args.run)
    data_dir = args.data_dir or recorded_path(settings.get("data_dir") or "data", working_dir_of(args.run, settings))
    try:
        pairs = checked_predictions_and_gold(args.run, data_dir)  # its best.json's CSVs, scoring what it records
    except (DataError, PredictionsFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    flat = [values for task in MULTITASK for values in pairs[task]]
    print("\n".join(report(error_counts(*flat))))
    try:
        with locked_folder(output_dir):  # a run writing there at once would interleave its plots with these
            paths = plot_error_analysis(*flat, output_dir)
    except DataError as err:  # the lock: the run is writing there now
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {output_dir}: cannot write there ({err.strerror or err})", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {path}" for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
