"""The course's tab-separated task files (SST, CFIMDB, Quora, STS), read and validated for the tasks that use them.

File format, as the course ships it (read here with the csv module, delimiter tab, standard
double-quote quoting, as the course's csv.DictReader reads them, with one record per line: a stray
quote that would make the csv module swallow the following rows is an error naming its line):

    train/dev:      <index>  id  sentence  sentiment                (ids-sst-*, ids-cfimdb-*)
                    <index>  id  sentence1  sentence2  is_duplicate  (quora-*) or ... similarity (sts-*)
    test-student:   the same without the label column; the SST and CFIMDB ones carry two
                    leading index columns (header "0<TAB><TAB>id<TAB>sentence").

The first column(s) are unnamed pandas indexes and are ignored; only named columns are used.
Labels are written "3" (SST/CFIMDB) or "0.0"/"4.6" (Quora/STS). Text is kept as written apart
from stripping surrounding whitespace: the uncased tokenizer does the lowercasing.

Every problem with a file is a DataError "<path>:<line>: <problem>" raised at load time. Two
kinds of row are dropped, never silently (a DataWarning gives the count, the file and the lines):
rows whose label cell is empty in a labelled split (the course's quora-dev.csv has two,
which the course's loader also skipped), and training rows with an empty sentence. Dev and test
rows with an empty sentence are kept, because every id there must get a prediction.

write_examples writes examples back in this format (an index column, then id, the text columns and the label), as
read_rows reads them: the robustness suite's perturbed dev sets.
"""
from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from minbert.files import DataError, DataWarning, atomic_write_text, read_input_text

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class SentenceExample:
    id: str
    sentence: str
    label: int | None


@dataclass(frozen=True)
class PairExample:
    id: str
    sentence1: str
    sentence2: str
    label: float | None


def read_rows(path: str | Path, split: str, text_columns: tuple[str, ...], label_column: str,
              label_problem: Callable[[float], str | None], task: str) -> list[tuple[str, tuple[str, ...], float | None]]:
    """(id, texts, label) of every usable row of a course file; label None for split "test". `label_problem(value)`
    says what a label must be when `value` is not one ("an integer 0-4"), None when it is; `task` names the
    task in that error."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    labelled = split != "test"
    required = ("id",) + text_columns + ((label_column,) if labelled else ())
    header, rows = _read_table(path, required)
    column = {name: i for i, name in enumerate(header)}  # a repeated name keeps its last position, as in DictReader

    loaded = []
    first_line_of_id: dict[str, int] = {}
    unlabelled_lines, empty_text_lines = [], []
    for line, fields in rows:
        example_id = fields[column["id"]].strip()
        if not example_id:
            raise DataError(path, "empty id", line)
        if example_id in first_line_of_id:
            raise DataError(path, f"duplicate id {example_id!r} (first on line {first_line_of_id[example_id]})", line)
        first_line_of_id[example_id] = line

        texts = tuple(fields[column[name]].strip() for name in text_columns)
        label = None
        if labelled:
            label_text = fields[column[label_column]].strip()
            if not label_text:
                unlabelled_lines.append(line)
                continue
            label = _parse_label(label_text, label_problem, task, path, line)
        if split == "train" and not all(texts):
            empty_text_lines.append(line)
            continue
        loaded.append((example_id, texts, label))

    _warn_dropped(path, unlabelled_lines, f"an empty '{label_column}' label")
    _warn_dropped(path, empty_text_lines, "an empty sentence")
    if not loaded:
        raise DataError(path, "no usable rows: every row was dropped (see the warnings)")
    return loaded


def write_examples(path: str | Path, examples: Sequence[SentenceExample | PairExample], text_columns: tuple[str, ...],
                   label_column: str) -> None:
    """`examples` as a course file with `text_columns` and, when every example has a label, `label_column` (a dev
    file; else a test file): the csv module's tab-separated quoting, one record per line, which read_rows reads
    back as they are. ValueError for a text holding a line break, which no course file's record can."""
    labelled = all(example.label is not None for example in examples)
    text = io.StringIO()
    writer = csv.writer(text, delimiter="\t", lineterminator="\n")
    writer.writerow(["", "id", *text_columns, *([label_column] if labelled else [])])
    for index, example in enumerate(examples):
        texts = [getattr(example, column) for column in text_columns]
        if any("\n" in value or "\r" in value for value in texts):
            raise ValueError(f"{path}: example {example.id!r} holds a line break, which a course file cannot")
        writer.writerow([index, example.id, *texts, *([example.label] if labelled else [])])
    atomic_write_text(path, text.getvalue())


def _read_table(path: str | Path, required_columns: Sequence[str]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (first line number, fields) of every record; blank lines are not records."""
    path = Path(path)
    text = read_input_text(path)
    if not text.strip():
        raise DataError(path, "file is empty")

    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    header: list[str] | None = None
    header_line = 1
    rows = []
    last_line_read = 0
    try:
        for fields in reader:
            first_line, last_line_read = last_line_read + 1, reader.line_num
            if not fields:
                continue
            if header is None:
                header, header_line = fields, first_line
                continue
            if len(fields) != len(header):
                raise DataError(path, f"expected {len(header)} tab-separated fields as in the header, found "
                                      f"{len(fields)} (a stray tab or an unbalanced quote?)", first_line)
            if last_line_read > first_line:
                # The course's files hold one record per line; a record over several lines is a double
                # quote opening a field that the csv module then runs on to the next quote, rows and all.
                raise DataError(path, f"a double quote opens a field that runs on to line {last_line_read}; the "
                                      "course's files hold one record per line (a stray quote? double it as \"\" "
                                      "inside a quoted field)", first_line)
            rows.append((first_line, fields))
    except csv.Error as err:
        raise DataError(path, f"malformed CSV ({err})", last_line_read + 1) from None

    for name in required_columns:
        if name not in header:
            found = ", ".join(repr(h) for h in header)
            raise DataError(path, f"missing required column {name!r} (header has {found})", header_line)
    if not rows:
        raise DataError(path, "header but no data rows")
    return header, rows


def _parse_label(text: str, label_problem: Callable[[float], str | None], task: str, path: str | Path,
                 line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(path, f"label {text!r} is not a number", line) from None
    expected = label_problem(value)
    if expected is not None:
        raise DataError(path, f"{task} label {text!r} out of range (expected {expected})", line)
    return value


def _warn_dropped(path: str | Path, lines: list[int], reason: str) -> None:
    if not lines:
        return
    shown = ", ".join(str(n) for n in lines[:10]) + (", ..." if len(lines) > 10 else "")
    warnings.warn(f"{path}: dropped {len(lines)} row(s) with {reason} (lines {shown})", DataWarning, stacklevel=4)
