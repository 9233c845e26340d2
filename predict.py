"""Predict with a trained run's kept model on any text: a course-format file, a JSON-lines file or lines on standard
input (one sentence, or a pair's two sentences separated by a tab).

    python predict.py runs/demo --task sst --input data/demo/ids-sst-dev.csv --output sst-dev.csv   # the course CSV
    echo "A gripping, funny film." | python predict.py runs/demo --task sst                        # JSON lines
    printf 'How do I learn Python?\\tWhat is the best way to learn Python?\\n' | python predict.py runs/demo --task qqp
    python predict.py runs/demo --task sts --input pairs.jsonl --output scores.jsonl

RUN is a run's folder (its kept model, OUTPUT_DIR/best) or a checkpoint prefix (runs/demo/stage_3). The model
predicts as its run did: the run's --max_length, --eval_batch_size and precision (resolved on this device), batches
sorted by length. JSON lines hold each example's id, label (a class, or STS's 0-5 score), the score the label is
decided from (SST's five logits, QQP's logit, STS's score) and, for SST and QQP, the class probabilities; the CSV is
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
from minbert.model.multitask_bert import load_multitask_checkpoint
from minbert.prediction.new_inputs import (INPUT_FORMATS, OUTPUT_FORMATS, STANDARD_STREAM, input_format,
                                           output_format, prediction_records, read_examples)
from minbert.run.kept_model import KEPT_MODEL, checkpoint_prefix, kept_predictor, missing_head
from minbert.runtime import PRECISIONS, resolve_device, use_tf32
from minbert.tasks import TASKS, TEXT_TASKS, task_name
from minbert.tasks.base import decided, prediction_rows
from minbert.tasks.calibration import calibration_path, read_calibration
from minbert.tasks.score_files import ScoresFileError

CALIBRATED = tuple(name for name in TEXT_TASKS if TASKS[name].calibrated)  # --calibrated's tasks
THRESHOLDED = tuple(name for name in TEXT_TASKS if TASKS[name].has_threshold)  # --threshold's


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


def dev_fitted(args: argparse.Namespace, prefix: Path) -> tuple[float, float | None]:
    """The temperature (--calibrated; else 1) and the decision threshold (--threshold; else None) fitted on the run's
    dev set, from its calibration.json; ScoresFileError when it lacks them or the checkpoint is not the kept model
    they were fitted on."""
    if not (args.calibrated or args.threshold):
        return 1.0, None
    flags = " and ".join(flag for flag, asked in (("--calibrated", args.calibrated), ("--threshold", args.threshold))
                         if asked)
    if prefix.name != KEPT_MODEL:
        raise ScoresFileError(f"{flags}: {calibration_path(prefix.parent)} was fitted on the kept model "
                              f"({KEPT_MODEL}), not {prefix.name}")
    tasks = read_calibration(prefix.parent)
    if args.task not in tasks:
        raise ScoresFileError(f"{flags}: {calibration_path(prefix.parent)} has no {args.task} (the run did not "
                              "train it, or its dev set was too small to calibrate)")
    entry = tasks[args.task]
    return (entry["temperature"] if args.calibrated else 1.0), (entry["threshold"]["logit"] if args.threshold
                                                                else None)


def write(args: argparse.Namespace, ids: list[str], scores, temperature: float = 1.0,
          threshold: float | None = None) -> None:
    """The predictions as --output_format says, at a decision `threshold` if given, with probabilities of the
    logits divided by `temperature`."""
    task = TASKS[args.task]
    if args.output_format == "csv":
        predictions = decided(task, scores, threshold)[1].tolist()
        if args.output == STANDARD_STREAM:
            csv.writer(sys.stdout, lineterminator="\n").writerows(prediction_rows(task, "<stdout>", ids, predictions))
        else:
            task.write_predictions(args.output, ids, predictions)
        return
    text = "".join(json.dumps(record) + "\n"
                   for record in prediction_records(task, ids, scores, temperature, threshold))
    if args.output == STANDARD_STREAM:
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)


def predict(args: argparse.Namespace) -> int:
    prefix = checkpoint_prefix(args.run)
    if args.output != STANDARD_STREAM:
        output = Path(args.output)
        problem = unwritable_folder(output.parent) or (f"{output}: a folder; name the file to write"
                                                       if output.is_dir() else None)
        if problem:
            raise OutputError(f"--output {problem}")
        problem = forbidden_output("--output", output, [] if args.input == STANDARD_STREAM else [args.input],
                                   [args.run])
        if problem:
            raise OutputError(problem)
    examples = read_examples(TASKS[args.task], args.input, args.input_format)  # every input problem before loading
    temperature, threshold = dev_fitted(args, prefix)
    device = resolve_device(args.use_gpu)
    use_tf32(device)
    model, metadata = load_multitask_checkpoint(prefix, device)
    problem = missing_head(model, prefix, args.task)
    if problem:
        raise problem
    predictor = kept_predictor(model, prefix, metadata, device, args.batch_size, args.precision, args.quiet)
    ids, scores = predictor.predict(args.task, examples, scores=True)
    write(args, ids, scores, temperature, threshold)
    if args.output != STANDARD_STREAM:
        print(f"wrote {args.output} ({len(ids)} {args.task} predictions)", file=sys.stderr)
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
