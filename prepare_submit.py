"""Build the Gradescope zip for the CS224N default final project.

    python prepare_submit.py [--predictions_dir predictions] [--out cs224n_default_final_project_submission.zip]
                             [--part multitask|minbert]

multitask: the six leaderboard CSVs (sst/para/sts × dev/test).
minbert:   the handout part 1 files, {pretrain,finetune}-{sst,cfimdb}-{dev,test}-out.csv, plus
           bert.py, classifier.py and optimizer.py from the current directory.

Every CSV is checked before the zip is written: it exists, has the right header, at least one row,
no duplicate ids, values in range (SST 0-4, QQP and CFIMDB 0/1, STS finite) and, when the split's data
file is in --data_dir, exactly the ids of that file (rows the loaders drop, e.g. dev rows without a
label, are not expected). The zip is written to a temporary file first, so a failed run never
leaves a partial archive; a problem is one line naming the file, exit code 2.
CSVs are stored as predictions/<name> whatever --predictions_dir is, the layout the graders expect.
"""

import argparse
import sys
import zipfile
from pathlib import Path

from evaluation import DEFAULT_OUTPUTS, PredictionsFileError, check_predictions_file
from minbert.arguments import OneLineErrorParser
from minbert.data.batches import DataError, load_examples, show_data_warnings_on_one_line, standard_paths
from minbert.files import atomic_write, describe_os_error, forbidden_output, unwritable_folder
from minbert.run.run_files import replaces_run_file
from minbert.tasks import PART1_TASKS

MINBERT_CODE_FILES = ("bert.py", "classifier.py", "optimizer.py")


class SubmissionError(Exception):
    """A file needed for the submission is missing; the message names it."""


def submission_predictions(part: str) -> list[tuple[str, str, str]]:
    """(CSV file name, task, split) of every file the given project part requires."""
    if part == "multitask":
        return [(Path(path).name, task, split) for (task, split), path in DEFAULT_OUTPUTS.items()]
    return [
        (f"{mode}-{dataset}-{split}-out.csv", dataset, split)
        for mode in ("pretrain", "finetune")
        for dataset in PART1_TASKS
        for split in ("dev", "test")
    ]


def expected_ids(data_dir: Path | None, task: str, split: str) -> list[str] | None:
    """The ids a predictions file must answer, from the split's data file; None when it is not at hand."""
    if data_dir is None:
        return None
    path = standard_paths(data_dir)[(task, split)]
    return [example.id for example in load_examples(path, task, split)] if path.is_file() else None


def build_submission(predictions_dir: Path, out: Path, part: str, data_dir: Path | None = None) -> list[str]:
    """Validate every required file (against data_dir's splits where present), then write the zip;
    returns the archive member names."""
    problem = unwritable_folder(out.parent) or (f"--out {out}: a folder; name the zip file to write" if out.is_dir()
                                                else None)
    # Not onto a file it reads (a CSV, a data file, the code it zips), nor into another run's folder; beside the run
    # whose CSVs it zips (the Colab notebook's RUN/cs224n_...zip) it may, but never over one of that run's files.
    reads = [predictions_dir / name for name, _, _ in submission_predictions(part)]
    reads += list(standard_paths(data_dir).values()) if data_dir is not None else []
    reads += list(MINBERT_CODE_FILES) if part == "minbert" else []
    problem = (problem or forbidden_output("--out", out, reads, own_runs=[predictions_dir])
               or replaces_run_file("--out", out))
    if problem:  # known before any file is read
        raise SubmissionError(problem)
    members: list[tuple[Path, str]] = []
    unchecked = []
    for name, task, split in submission_predictions(part):
        csv_path = predictions_dir / name
        ids = expected_ids(data_dir, task, split)
        if ids is None:
            unchecked.append(name)
        check_predictions_file(csv_path, ids, task)
        members.append((csv_path, f"predictions/{name}"))
    if unchecked:
        print(f"note: ids not checked for {', '.join(unchecked)} (their data files are not in --data_dir "
              f"{data_dir})", file=sys.stderr)
    if part == "minbert":
        for name in MINBERT_CODE_FILES:
            if not Path(name).is_file():
                raise SubmissionError(f"{name}: file not found in {Path.cwd()}")
            members.append((Path(name), name))

    atomic_write(out, lambda path: write_zip(path, members))
    return [arcname for _, arcname in members]


def write_zip(path: Path, members: list[tuple[Path, str]]) -> None:
    """A zip of the members, each (a file, its name in the zip)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for source, arcname in members:
            archive.write(source, arcname)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineErrorParser(description="Zip the CS224N default final project submission.")
    parser.add_argument("--predictions_dir", type=Path, default=Path("predictions"),
                        help="the CSVs' folder: a run's own RUN/predictions, or the handout's predictions/ (the "
                             "default), where a run writes them when its --*_out flags name them")
    parser.add_argument("--out", type=Path, default=Path("cs224n_default_final_project_submission.zip"))
    parser.add_argument("--part", choices=("multitask", "minbert"), default="multitask")
    parser.add_argument("--data_dir", type=Path,
                        help="the course's data files, to check that every id is answered once (default: data, "
                             "where it is a folder)")
    args = parser.parse_args(argv)
    if args.data_dir is not None and not args.data_dir.is_dir():  # named, so the ids are meant to be checked
        parser.error(f"--data_dir {args.data_dir}: not a folder")
    args.data_dir = args.data_dir or Path("data")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    show_data_warnings_on_one_line()
    try:
        members = build_submission(args.predictions_dir, args.out, args.part, args.data_dir)
    except (PredictionsFileError, SubmissionError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, a read-only folder (files.OutputError)
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} with {len(members)} files: {', '.join(members)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
