"""New text for a trained model: examples read from a course-format file, a JSON-lines file or plain lines, and
its predictions as the course's CSV or as JSON lines with the label, the score and the class probabilities.

    examples = read_examples(TASKS["sts"], "pairs.txt", "lines")   # one pair a line, its two sentences tab-separated
    records = predictions_of(TASKS["sts"], ids, scores).records()  # [{"id", "label", "score"}]; SST and QQP: the
                                      # class's name, "class", "probabilities" by class name, "logits" / "logit"

The formats, for a task whose examples are sentences (`text_columns`: SST's "sentence", QQP's and STS's
"sentence1" and "sentence2"; SQuAD's questions are read from its own JSON by multitask_classifier.py):
    course   the task's own data file (tab-separated with a header: id and the text columns; a label column, as
             in a dev file, is not read: predicting needs no label, so a row whose label cell is empty is
             predicted too)
    jsonl    one JSON object a line holding the text columns by name and optionally "id" (else the line number;
             an empty id is refused, as the course loader refuses one)
    lines    one example a line: a sentence, or a pair's two sentences separated by a tab; the id is the line
             number; blank lines are skipped
Lines end at "\n" alone (one "\r" before it dropped): a text may hold U+2028, U+0085 or a form feed (text_lines).
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from minbert.files import DataError, read_input_text, text_lines
from minbert.tasks.base import Task, decided
from minbert.tasks.classification import Classification
from minbert.tasks.course_files import PairExample, SentenceExample

INPUT_FORMATS = ("course", "jsonl", "lines")
OUTPUT_FORMATS = ("csv", "jsonl")
STANDARD_STREAM = "-"


def input_format(source: str, asked: str | None) -> str:
    """The format asked for, or the one the source's name implies: standard input and .txt plain lines, .jsonl JSON
    lines, anything else the task's course format."""
    if asked is not None:
        return asked
    if source == STANDARD_STREAM:
        return "lines"
    return {".jsonl": "jsonl", ".txt": "lines"}.get(Path(source).suffix.lower(), "course")


def output_format(destination: str, asked: str | None) -> str:
    """The format asked for, or the one the destination implies: the course's CSV for a .csv file, else JSON lines."""
    if asked is not None:
        return asked
    return "csv" if destination != STANDARD_STREAM and Path(destination).suffix.lower() == ".csv" else "jsonl"


def read_examples(task: Task, source: str, fmt: str, stdin: TextIO | None = None) -> list:
    """The examples of `source` (a path, or "-" for `stdin`) in `fmt`; a DataError naming the file and line for
    anything the task cannot read."""
    if fmt == "course":
        return task.data.load(source, "test")  # the text columns alone: every row is predicted, labelled or not
    name = "<stdin>" if source == STANDARD_STREAM else source
    text = (stdin or sys.stdin).read() if source == STANDARD_STREAM else read_input_text(source)
    rows = _json_rows(task, name, text) if fmt == "jsonl" else _plain_rows(task, name, text)
    if not rows:
        raise DataError(name, "no examples: every line is blank")
    seen: dict[str, int] = {}
    for line, example_id, _ in rows:
        if example_id in seen:
            raise DataError(name, f"duplicate id {example_id!r} (first on line {seen[example_id]})", line)
        seen[example_id] = line
    return [_example(task, example_id, texts) for _, example_id, texts in rows]


def _plain_rows(task: Task, name: str, text: str) -> list[tuple[int, str, tuple[str, ...]]]:
    rows = []
    for number, line in enumerate(text_lines(text), start=1):
        if not line.strip():
            continue
        texts = tuple(part.strip() for part in line.split("\t"))
        if len(texts) != len(task.text_columns):
            want = "a sentence" if len(task.text_columns) == 1 else "two sentences separated by a tab"
            raise DataError(name, f"{task.name} reads one example a line, {want}; found {len(texts)} "
                                  f"tab-separated field{'s' * (len(texts) != 1)}", number)
        rows.append((number, str(number), texts))
    return rows


def _json_rows(task: Task, name: str, text: str) -> list[tuple[int, str, tuple[str, ...]]]:
    rows = []
    for number, line in enumerate(text_lines(text), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as err:
            raise DataError(name, f"not a JSON value ({type(err).__name__}: {err})", number) from None
        if not isinstance(value, dict):
            raise DataError(name, f"a line must be a JSON object, found a {type(value).__name__}", number)
        fields = {"id": str(number), **value}
        for column in ("id", *task.text_columns):
            value = fields.get(column)
            if not isinstance(value, str) and not (column == "id" and type(value) is int):
                found = "missing" if column not in fields else f"found {type(value).__name__}"
                raise DataError(name, f"{column!r} must be a string ({found}); {task.name} reads "
                                      f"{', '.join(repr(c) for c in task.text_columns)} and optionally 'id'", number)
        example_id = str(fields["id"]).strip()
        if not example_id:
            raise DataError(name, "empty id", number)
        rows.append((number, example_id, tuple(str(fields[c]).strip() for c in task.text_columns)))
    return rows


def _example(task: Task, example_id: str, texts: tuple[str, ...]) -> SentenceExample | PairExample:
    return SentenceExample(example_id, *texts, None) if len(texts) == 1 else PairExample(example_id, *texts, None)


def examples_of_texts(task: Task, texts: Sequence[str | Sequence[str]]) -> list[SentenceExample | PairExample]:
    """Examples of texts given in code: a sentence each, or a pair's two sentences each (a tuple or list), ids "1",
    "2", ... as the lines format numbers them; ValueError naming the first text the task cannot read."""
    if isinstance(texts, str):
        raise ValueError(f"{task.name}: give a list of texts, not one string")
    examples = []
    for number, text in enumerate(texts, start=1):
        parts = (text,) if isinstance(text, str) else tuple(text)
        if len(parts) != len(task.text_columns) or not all(isinstance(part, str) for part in parts):
            want = "a string" if len(task.text_columns) == 1 else "a pair of strings"
            raise ValueError(f"{task.name}: text {number} must be {want}, got {text!r}")
        examples.append(_example(task, str(number), parts))
    return examples


@dataclass(frozen=True)
class Predictions:
    """A task's predictions of examples: `labels` (a class, or STS's 0-5 score; at a decision threshold if one was
    given), `probabilities` (N, C) of a classification task's classes (of the logits divided by a temperature:
    calibrated ones when it was fitted on dev), `scores` as the run saves them (SST's logits, QQP's logit, STS's
    score) and each label in words (`label_names`: a class's name, STS's score as a number)."""
    task: Task
    ids: list[str]
    labels: np.ndarray
    probabilities: np.ndarray | None
    scores: np.ndarray

    @property
    def label_names(self) -> list[str | float]:
        if isinstance(self.task, Classification):
            return [self.task.outputs.class_name(int(label)) for label in self.labels]
        return [self.task.outputs.parse_prediction(self.task.outputs.format_prediction(label)) for label in self.labels]

    def records(self) -> list[dict]:
        """predict.py's JSON lines: each example's id, label (a class's name, or STS's score), for a classification
        task its class number ("class") and probabilities by class name, and its score under the task's name for
        it (score_name: "logits", "logit", "score")."""
        records = []
        for index, (example_id, name) in enumerate(zip(self.ids, self.label_names)):
            record = {"id": example_id, "label": name}
            if self.probabilities is not None:
                record["class"] = int(self.labels[index])
                record["probabilities"] = {self.task.outputs.class_name(c): round(float(p), 6)
                                           for c, p in enumerate(np.atleast_1d(self.probabilities[index]))}
            record[score_name(self.task)] = self.scores[index].tolist()
            records.append(record)
        return records


def score_name(task: Task) -> str:
    """What the JSON lines call the score a prediction is decided from: the task's one scores-file column (QQP's
    'logit', STS's 'score'), or 'logits' for several (SST's)."""
    return task.outputs.score_columns[0] if len(task.outputs.score_columns) == 1 else "logits"


def predictions_of(task: Task, ids: Sequence[str], scores: np.ndarray, temperature: float = 1.0,
                   threshold: float | None = None) -> Predictions:
    """The predictions of a model's `scores` of the examples `ids`: labels decided as the run decides them (at a
    decision `threshold` if given) and class probabilities of the logits divided by `temperature` (one fitted on
    dev: calibrated ones)."""
    values, labels = decided(task, scores, threshold)
    probabilities = task.outputs.probabilities(values / temperature) if isinstance(task, Classification) else None
    return Predictions(task, list(ids), labels, probabilities, values)
