"""Fetch the CS224N minBERT task files into --data_dir, checking each file's row count.

    python scripts/download_data.py --data_dir data [--force] [--squad]

The course files (SST, CFIMDB, Quora, STS: ids-sst-*.csv, ...) come from the course's public starter
repository. With --squad the script also fetches SQuAD 2.0 (the qa task) from its official site,
https://rajpurkar.github.io/SQuAD-explorer/dataset/: train-v2.0.json and dev-v2.0.json, written into
--data_dir unchanged and read under those names (`--data_dir data`). The official test set is hidden
(scored on CodaLab only), so there is no test-v2.0.json to fetch: with the official files, dev is the dev
set and there is no test split (this project's offline protocol instead splits the official dev set by
article into train / dev / test files under the same names).

Each file is checked (course CSVs: UTF-8 and number of data rows; SQuAD: a v2.0 JSON file and its
number of questions) before it is written, and written atomically, so an interrupted run never leaves a
partial file under a data file name. Without network access the script says where the files must go
and exits with status 1.
"""
from __future__ import annotations

import argparse
import csv
import http.client
import io
import json
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from minbert.arguments import OneLineErrorParser, flags_given
from minbert.data.batches import standard_paths
from minbert.files import atomic_write_bytes, unwritable_folder

SOURCE_URL = "https://raw.githubusercontent.com/gpoesia/minbert-default-final-project/HEAD/data/"
SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"

# Data rows (header not counted) of the course files, counted on verified copies. The Quora train
# and test files had no copy to count (the handout quotes 141,506 and 40,431 lines), so for them
# only a non-empty table is required.
EXPECTED_ROWS = {
    "ids-sst-train.csv": 8544, "ids-sst-dev.csv": 1101, "ids-sst-test-student.csv": 2210,
    "ids-cfimdb-train.csv": 1707, "ids-cfimdb-dev.csv": 245, "ids-cfimdb-test-student.csv": 488,
    "quora-train.csv": None, "quora-dev.csv": 20214, "quora-test-student.csv": None,
    "sts-train.csv": 6040, "sts-dev.csv": 863, "sts-test-student.csv": 1725,
}
# Questions in the official SQuAD 2.0 files (--squad); the official test-v2.0.json is hidden.
SQUAD_QUESTIONS = {"train-v2.0.json": 130319, "dev-v2.0.json": 11873}
SQUAD_HIDDEN = "test-v2.0.json"


class DownloadError(Exception):
    """A file could not be fetched or failed its check; str() is the one-line reason."""


def url_folder(text: str) -> str:
    """argparse's type of --base_url and --squad_url: a URL urllib fetches (http, https, ftp or file), ending in / as
    the file names are appended to it (urllib's ValueError for 'notaurl' was a traceback)."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https", "ftp", "file") or (parts.scheme != "file" and not parts.netloc):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s), ftp or file URL")
    if not text.endswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r} must end in / (the file names are appended to it)")
    return text


def fetch(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def count_data_rows(content: bytes) -> int:
    """Tab-separated records after the header, read the way the loaders read them."""
    text = content.decode("utf-8")
    records = [fields for fields in csv.reader(io.StringIO(text, newline=""), delimiter="\t") if fields]
    return max(len(records) - 1, 0)


def count_squad_questions(content: bytes) -> int:
    """Questions of an official SQuAD 2.0 JSON file ({"version": "v2.0", "data": [articles]})."""
    document = json.loads(content.decode("utf-8"))
    if not isinstance(document, dict) or document.get("version") != "v2.0" or not isinstance(document.get("data"), list):
        raise ValueError('expected {"version": "v2.0", "data": [articles]}')
    return sum(len(paragraph["qas"]) for article in document["data"] for paragraph in article["paragraphs"])


def where_files_go(folder: Path) -> str:
    return (f"place the course files in {folder}/ yourself: {', '.join(EXPECTED_ROWS)}; for SQuAD 2.0 (--squad), "
            f"the official {' and '.join(SQUAD_QUESTIONS)} from {SQUAD_URL} unchanged (the official "
            f"{SQUAD_HIDDEN} is hidden: dev is the dev set, and there is no test)")


def fetch_or_explain(url: str, folder: Path) -> bytes:
    try:
        return fetch(url)
    except (OSError, http.client.HTTPException) as err:  # URLError, HTTPError and timeouts are OSErrors
        reason = getattr(err, "reason", None) or err
        raise DownloadError(f"cannot download {url} ({reason}): offline or source unavailable; "
                            f"{where_files_go(folder)}") from None


def download(name: str, target: Path, base_url: str) -> int:
    url = base_url + name
    content = fetch_or_explain(url, target.parent)
    try:
        rows = count_data_rows(content)
    except (UnicodeDecodeError, csv.Error) as err:
        raise DownloadError(f"{url}: not a UTF-8 tab-separated file ({err}); nothing written") from None
    expected = EXPECTED_ROWS[name]
    if (expected is not None and rows != expected) or rows == 0:
        raise DownloadError(f"{url}: {rows} data rows, expected {expected or 'at least 1'}; nothing written")
    atomic_write_bytes(target, content)
    return rows


def download_squad(name: str, target: Path, base_url: str) -> int:
    """One official SQuAD 2.0 file, written unchanged once it parses and has its number of questions."""
    url = base_url + name
    content = fetch_or_explain(url, target.parent)
    try:
        questions = count_squad_questions(content)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
        raise DownloadError(f"{url}: not a SQuAD 2.0 JSON file ({err}); nothing written") from None
    expected = SQUAD_QUESTIONS[name]
    if questions != expected:
        raise DownloadError(f"{url}: {questions} questions, expected {expected}; nothing written")
    atomic_write_bytes(target, content)
    return questions


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", type=Path, default=Path("data"))
    parser.add_argument("--force", action="store_true", help="download again files that are already there")
    parser.add_argument("--base_url", type=url_folder, default=SOURCE_URL,
                        help="where the course files are (a URL ending in /)")
    parser.add_argument("--squad", action="store_true",
                        help="also fetch the official SQuAD 2.0 train-v2.0.json and dev-v2.0.json (the qa task)")
    parser.add_argument("--squad_url", type=url_folder, default=SQUAD_URL,
                        help="where the SQuAD 2.0 files are (a URL ending in /; with --squad)")
    args = parser.parse_args(argv)
    if "squad_url" in flags_given(parser, argv) and not args.squad:
        parser.error("--squad_url would do nothing without --squad (only --squad fetches the SQuAD files)")
    problem = unwritable_folder(args.data_dir)  # a file there: mkdir's FileExistsError was a traceback
    if problem:
        parser.error(f"--data_dir {problem}")

    args.data_dir.mkdir(parents=True, exist_ok=True)
    # Every data file the loaders read (datasets.standard_paths): the course CSVs from the course's repository,
    # SQuAD's official files (with --squad) from its site; the hidden official test file from nowhere.
    paths = {path.name: path for path in standard_paths(args.data_dir).values()}
    targets = [(name, paths[name], download, args.base_url, "rows") for name in sorted(EXPECTED_ROWS)]
    if args.squad:
        targets += [(name, paths.get(name, args.data_dir / name), download_squad, args.squad_url, "questions")
                    for name in SQUAD_QUESTIONS]
    for name, target, get, base_url, unit in targets:
        if target.exists() and not args.force:
            print(f"{target}: already present, kept (use --force to fetch again)")
            continue
        try:
            count = get(name, target, base_url)
        except DownloadError as err:
            print(err, file=sys.stderr)
            return 1
        print(f"{target}: {count} {unit}")
    if args.squad:
        print(f"SQuAD 2.0: no {SQUAD_HIDDEN} (the official test set is hidden); dev-v2.0.json is the dev set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
