"""Predict with a trained run's kept model on any text: a course-format file, a JSON-lines file or lines on standard
input (one sentence, or a pair's two sentences separated by a tab).

    python predict.py runs/demo --task sst --input data/demo/ids-sst-dev.csv --output sst-dev.csv   # the course CSV
    echo "A gripping, funny film." | python predict.py runs/demo --task sst                        # JSON lines
    printf 'How do I learn Python?\\tWhat is the best way to learn Python?\\n' | python predict.py runs/demo --task qqp
    python predict.py runs/demo --task sts --input examples/new-pairs.jsonl --output scores.jsonl

RUN is a run's folder (its kept model, OUTPUT_DIR/best) or a checkpoint prefix (runs/demo/stage_3). The model
predicts as its run did: the run's --max_length, --eval_batch_size and precision (resolved on this device), batches
sorted by length. JSON lines hold each example's id, its label (SST's and QQP's class by name, "somewhat positive",
"paraphrase"; STS's 0-5 similarity), for SST and QQP its class number ("class") and the probabilities by class name,
and the raw score the label is decided from under the task's name for it: SST's five "logits", QQP's "logit", STS's
"score" (docs/python_api.md). The same predictions in Python: minbert.load_run (minbert/run/trained_run.py). The CSV is
the course's leaderboard format, byte for byte what the run wrote for the same file. --calibrated divides the logits
by the temperature fitted on the run's dev set before the probabilities (the labels stay); --threshold decides QQP at
the threshold chosen on the run's dev set instead of probability 0.5: both read RUN/calibration.json, which a run
writes at its end (scripts/calibrate.py for an older run). Formats follow the names
(.jsonl: JSON lines; .txt and standard input: plain lines; .csv output: the course's CSV; else the task's course
file in, JSON lines out) unless --input_format / --output_format say otherwise (minbert/prediction/new_inputs.py).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from base_bert import CheckpointError
from minbert.arguments import OneLineErrorParser
from minbert.files import DataError, OutputError, atomic_write_text, forbidden_output, unwritable_folder
from minbert.prediction.new_inputs import (INPUT_FORMATS, OUTPUT_FORMATS, STANDARD_STREAM, Predictions,
                                           input_format, output_format, read_examples)
from minbert.run.kept_model import checkpoint_prefix
from minbert.run.trained_run import dev_fitted, load_run
from minbert.runtime import PRECISIONS, resolve_device
from minbert.tasks import TASKS, TEXT_TASKS, task_name
from minbert.tasks.base import prediction_rows
from minbert.tasks.score_files import ScoresFileError

CALIBRATED = tuple(name for name in TEXT_TASKS if TASKS[name].calibrated)  # --calibrated's tasks
THRESHOLDED = tuple(name for name in TEXT_TASKS if TASKS[name].has_threshold)  # --threshold's
FLAG_NAMES = ("--calibrated", "--threshold")


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run's folder (its kept model, best) or a checkpoint prefix")
    parser.add_argument("--task", required=True, help=f"one of {', '.join(TEXT_TASKS)} (or a course alias)")
    parser.add_argument("--input", default=STANDARD_STREAM, help="a file, or - for standard input (the default)")
    parser.add_argument("--input_format", choices=INPUT_FORMATS, help="default: from --input's name")
    parser.add_argument("--output", default=STANDARD_STREAM, help="a file, or - for standard output (the default)")
    parser.add_argument("--output_format", choices=OUTPUT_FORMATS, help="default: csv for a .csv file, else jsonl")
    parser.add_argument("--batch_size", type=int, help="default: the run's --eval_batch_size")
    parser.add_argument("--precision", choices=PRECISIONS, help="default: the run's --precision, on this device")
    parser.add_argument("--use_gpu", action="store_true", help="predict on CUDA when there is a GPU")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--calibrated", action="store_true",
                        help="probabilities of the logits divided by the temperature fitted on the run's dev set")
    parser.add_argument("--threshold", action="store_true",
                        help="labels decided at the threshold chosen on the run's dev set, not at probability 0.5")
    args = parser.parse_args(argv)
    try:
        args.task = task_name(args.task, TEXT_TASKS)
    except ValueError as err:
        parser.error(f"--task: {err}")
    if args.calibrated and not TASKS[args.task].calibrated:
        parser.error(f"--calibrated: {args.task} has no temperature (the calibrated tasks: {', '.join(CALIBRATED)})")
    if args.threshold and not TASKS[args.task].has_threshold:
        parser.error(f"--threshold: {args.task} has no decision threshold (the tasks with one: "
                     f"{', '.join(THRESHOLDED)})")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch_size must be >= 1, got {args.batch_size}")
    args.input_format = input_format(args.input, args.input_format)
    args.output_format = output_format(args.output, args.output_format)
    return args


def write(args: argparse.Namespace, predictions: Predictions) -> None:
    """The predictions as --output_format says."""
    task = predictions.task
    if args.output_format == "csv":
        labels = predictions.labels.tolist()
        if args.output == STANDARD_STREAM:
            rows = prediction_rows(task, "<stdout>", predictions.ids, labels)
            csv.writer(sys.stdout, lineterminator="\n").writerows(rows)
        else:
            task.outputs.write_predictions(args.output, predictions.ids, labels)
        return
    text = "".join(json.dumps(record) + "\n" for record in predictions.records())
    if args.output == STANDARD_STREAM:
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)


def check_output(args: argparse.Namespace) -> None:
    """OutputError for an --output that cannot be written, would replace the input, or lies in a run's folder (the
    run it reads included: its kept model, records and leaderboard files are that run's)."""
    output = Path(args.output)
    problem = unwritable_folder(output.parent) or (f"{output}: a folder; name the file to write"
                                                   if output.is_dir() else None)
    if problem:
        raise OutputError(f"--output {problem}")
    problem = forbidden_output("--output", output, [] if args.input == STANDARD_STREAM else [args.input])
    if problem:
        raise OutputError(problem)


def predict(args: argparse.Namespace) -> int:
    prefix = checkpoint_prefix(args.run)
    if args.output != STANDARD_STREAM:
        check_output(args)
    examples = read_examples(TASKS[args.task], args.input, args.input_format)  # every input problem before loading
    dev_fitted(prefix, args.task, args.calibrated, args.threshold, FLAG_NAMES)
    run = load_run(prefix, resolve_device(args.use_gpu), args.batch_size, args.precision, args.quiet)
    predictions = run.predict_examples(args.task, examples, args.calibrated, args.threshold, FLAG_NAMES)
    write(args, predictions)
    if args.output != STANDARD_STREAM:
        print(f"wrote {args.output} ({len(predictions.ids)} {args.task} predictions)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return predict(args)
    except (CheckpointError, DataError, OutputError, ScoresFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
