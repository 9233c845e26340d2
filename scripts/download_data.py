"""Fetch the CS224N minBERT task files into --data_dir, checking each file's row count.

    python scripts/download_data.py --data_dir data [--force]

The files come from the course's public starter repository. Each is checked (UTF-8, number of
data rows) before it is written, and written atomically, so an interrupted run never leaves a
partial file under a course file name. Without network access the script says where the files
must go and exits with status 1.
"""
from __future__ import annotations

import argparse
import csv
import http.client
import io
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo's modules importable
from datasets import standard_paths  # noqa: E402

SOURCE_URL = "https://raw.githubusercontent.com/gpoesia/minbert-default-final-project/HEAD/data/"

# Data rows (header not counted) of the course files, counted on verified copies. The Quora train
# and test files had no copy to count (the handout quotes 141,506 and 40,431 lines), so for them
# only a non-empty table is required.
EXPECTED_ROWS = {
    "ids-sst-train.csv": 8544, "ids-sst-dev.csv": 1101, "ids-sst-test-student.csv": 2210,
    "ids-cfimdb-train.csv": 1707, "ids-cfimdb-dev.csv": 245, "ids-cfimdb-test-student.csv": 488,
    "quora-train.csv": None, "quora-dev.csv": 20214, "quora-test-student.csv": None,
    "sts-train.csv": 6040, "sts-dev.csv": 863, "sts-test-student.csv": 1725,
}


class DownloadError(Exception):
    """A file could not be fetched or failed its check; str() is the one-line reason."""


def fetch(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def count_data_rows(content: bytes) -> int:
    """Tab-separated records after the header, read the way the loaders read them."""
    text = content.decode("utf-8")
    records = [fields for fields in csv.reader(io.StringIO(text, newline=""), delimiter="\t") if fields]
    return max(len(records) - 1, 0)


def write_atomically(path: Path, content: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def download(name: str, target: Path, base_url: str) -> int:
    url = base_url + name
    try:
        content = fetch(url)
    except (OSError, http.client.HTTPException) as err:  # URLError, HTTPError and timeouts are OSErrors
        reason = getattr(err, "reason", None) or err
        raise DownloadError(f"cannot download {url} ({reason}): offline or source unavailable; place the course "
                            f"files in {target.parent}/ yourself: {', '.join(EXPECTED_ROWS)}") from None
    try:
        rows = count_data_rows(content)
    except (UnicodeDecodeError, csv.Error) as err:
        raise DownloadError(f"{url}: not a UTF-8 tab-separated file ({err}); nothing written") from None
    expected = EXPECTED_ROWS[name]
    if (expected is not None and rows != expected) or rows == 0:
        raise DownloadError(f"{url}: {rows} data rows, expected {expected or 'at least 1'}; nothing written")
    write_atomically(target, content)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", type=Path, default=Path("data"))
    parser.add_argument("--force", action="store_true", help="download again files that are already there")
    parser.add_argument("--base_url", default=SOURCE_URL, help="where the files are (a URL ending in /)")
    args = parser.parse_args(argv)

    args.data_dir.mkdir(parents=True, exist_ok=True)
    targets = sorted({path.name: path for path in standard_paths(args.data_dir).values()}.items())
    for name, target in targets:
        if target.exists() and not args.force:
            print(f"{target}: already present, kept (use --force to fetch again)")
            continue
        try:
            rows = download(name, target, args.base_url)
        except DownloadError as err:
            print(err, file=sys.stderr)
            return 1
        print(f"{target}: {rows} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
