"""Build the Gradescope zip for the CS224N default final project.

    python prepare_submit.py [--predictions_dir predictions] [--out cs224n_default_final_project_submission.zip]
                             [--part multitask|minbert]

multitask: the six leaderboard CSVs (sst/para/sts × dev/test).
minbert:   the handout part 1 files, {pretrain,finetune}-{sst,cfimdb}-{dev,test}-out.csv, plus
           bert.py, classifier.py and optimizer.py from the current directory.

Every CSV is checked (exists, right header, no duplicate ids) before the zip is written, and
the zip is written to a temporary file first, so a failed run never leaves a partial archive.
CSVs are stored as predictions/<name> whatever --predictions_dir is, the layout the graders expect.
"""

import argparse
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from evaluation import DEFAULT_OUTPUTS, PredictionsFileError, check_predictions_file

MINBERT_CODE_FILES = ("bert.py", "classifier.py", "optimizer.py")


class SubmissionError(Exception):
    """A file needed for the submission is missing; the message names it."""


def submission_predictions(part: str) -> list[tuple[str, str]]:
    """(CSV file name, evaluation task) pairs required for the given project part."""
    if part == "multitask":
        return [(Path(path).name, task) for (task, _split), path in DEFAULT_OUTPUTS.items()]
    return [
        (f"{mode}-{dataset}-{split}-out.csv", "sst")
        for mode in ("pretrain", "finetune")
        for dataset in ("sst", "cfimdb")
        for split in ("dev", "test")
    ]


def build_submission(predictions_dir: Path, out: Path, part: str) -> list[str]:
    """Validate every required file, then write the zip; returns the archive member names."""
    members: list[tuple[Path, str]] = []
    for name, task in submission_predictions(part):
        csv_path = predictions_dir / name
        check_predictions_file(csv_path, None, task)
        members.append((csv_path, f"predictions/{name}"))
    if part == "minbert":
        for name in MINBERT_CODE_FILES:
            if not Path(name).is_file():
                raise SubmissionError(f"{name}: file not found in {Path.cwd()}")
            members.append((Path(name), name))

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp_name, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for source, arcname in members:
                archive.write(source, arcname)
        os.replace(tmp_name, out)
    except BaseException:
        os.unlink(tmp_name)
        raise
    return [arcname for _, arcname in members]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Zip the CS224N default final project submission.")
    parser.add_argument("--predictions_dir", type=Path, default=Path("predictions"))
    parser.add_argument("--out", type=Path, default=Path("cs224n_default_final_project_submission.zip"))
    parser.add_argument("--part", choices=("multitask", "minbert"), default="multitask")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        members = build_submission(args.predictions_dir, args.out, args.part)
    except (PredictionsFileError, SubmissionError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} with {len(members)} files: {', '.join(members)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
