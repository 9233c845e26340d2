"""Problems with input files, reported as one line that names the file; output files written whole.

DataError is raised for a file that cannot be used (missing, malformed, inconsistent): the command lines
print it as `error: <file>[:<line>]: <problem>` and exit with code 2. DataWarning reports rows dropped on
purpose (counted, with their lines), never silently.
"""
from __future__ import annotations

import csv
import io
import os
import tempfile
import warnings
from pathlib import Path


class DataError(ValueError):
    """A data file is missing or malformed; str() is one line naming the file (and line)."""

    def __init__(self, path: str | Path, problem: str, line: int | None = None):
        self.path = str(path)
        self.problem = problem
        self.line = line
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {problem}")


class DataWarning(UserWarning):
    """Rows were dropped while loading; the message gives the count, the file and the lines."""


def show_data_warnings_on_one_line() -> None:
    """For the command lines: a DataWarning prints as 'warning: <message>', without source lines."""
    default = warnings.formatwarning

    def format_warning(message, category, *args, **kwargs):
        if issubclass(category, DataWarning):
            return f"warning: {message}\n"
        return default(message, category, *args, **kwargs)
    warnings.formatwarning = format_warning



def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary sibling and move it into place, so that a crash never leaves a truncated
    file that looks complete; the file gets the mode open() would give it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())  # mkstemp's 0600 would hide the file from other users
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_csv(path: str | os.PathLike, rows) -> None:
    """Rows (the header first) as a comma-separated file with "\n" line ends, written as atomic_write_text does."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    atomic_write_text(path, text.getvalue())


def new_file_mode() -> int:
    """The mode open() gives a new file under the current umask (mkstemp and safetensors use 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask
