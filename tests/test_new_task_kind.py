"""A new KIND of task is one new file too: a regression over sentence pairs (the share of words two sentences have in
common, a number in [0, 1]), a kind no task module is, written in a copy of the repository as one module of
minbert/tasks/ that implements the task's three small interfaces itself (minbert.tasks.base: TaskData, TaskModel,
TaskOutputs; pairs.py's reading of pair files and pair encodings are the only building blocks it takes), and trained
end to end by multitask_classifier.py: its dev metrics evaluated and kept, its leaderboard files and scores files
written, and a student distilled from its train scores."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_new_task import copy_of_the_repository

OVERLAP_TASK = '''"""Overlap: the share of words two sentences have in common, a number in [0, 1], in
overlap-{train,dev,test-student}.csv."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from minbert.tasks.base import Task, TaskOutputs
from minbert.tasks.metrics import sts_metrics
from minbert.tasks.pairs import PAIR_COLUMNS, PairData, PairModel


@dataclass(frozen=True)
class SquaredError:
    divergence: str = "squared"  # SMART's, should a run ask for it

    def loss(self, outputs, labels):
        return F.mse_loss(outputs.float(), labels.float())

    def score(self, outputs):
        return outputs.float()

    def decide(self, scores):
        return scores


class OverlapData(PairData):
    def label_problem(self, value):
        return None if 0 <= value <= 1 else "a number in [0, 1]"


class OverlapModel(PairModel):
    history_columns = (("overlap_pearson", "Overlap r"), ("overlap_mse", "Overlap MSE"))

    def feature_size(self, pair_encoders, hidden):
        return hidden if pair_encoders[self.task.name] == "cross" else 2 * hidden

    def outputs_of_embeddings(self, model, u, v):
        features = model.readout.features(self.task.name, torch.cat([u * v, (u - v).abs()], dim=-1))
        return self.head(model)(model.dropout(features)).squeeze(-1)

    def objective(self, options):
        return SquaredError()

    def distillation_loss(self, objective, outputs, teacher, ids, temperature):
        student = objective.score(outputs)
        return F.mse_loss(student, teacher.of(ids, student))

    def decide(self, scores):
        return scores

    def metrics(self, predictions, gold):
        predictions, gold = np.asarray(predictions, dtype=float), np.asarray(gold, dtype=float)
        return {"overlap_pearson": sts_metrics(predictions, gold)["pearson"],
                "overlap_mse": float(np.mean((predictions - gold) ** 2))}

    def kept_score(self, metrics):
        return (metrics["overlap_pearson"] + 1) / 2


class OverlapOutputs(TaskOutputs):
    score_columns = ("overlap",)

    def format_prediction(self, value):
        if not math.isfinite(float(value)):
            raise ValueError(f"overlap prediction {value!r} is not finite")
        return f"{float(value):.4f}"

    def parse_prediction(self, text):
        return float(text)


@dataclass(frozen=True, kw_only=True, eq=False)
class Overlap(Task):
    data_part = OverlapData
    model_part = OverlapModel
    outputs_part = OverlapOutputs


TASK = Overlap(name="overlap", order=10, trainable=True, title="Overlap", file_prefix="overlap",
               flag_prefix="overlap", label_column="overlap", text_columns=PAIR_COLUMNS,
               leaderboard_column="Predicted_Overlap", head_name="overlap_head")
'''
WORDS = ("the", "cat", "dog", "sleeps", "runs", "on", "mat", "in", "garden", "by", "door", "house")


def overlap_rows(count: int, offset: int) -> list[tuple[str, str, str, float]]:
    """(id, sentence1, sentence2, overlap) rows: two five-word sentences and the share of their words in common."""
    rows = []
    for i in range(offset, offset + count):
        first = [WORDS[(i + k) % len(WORDS)] for k in range(5)]
        second = [WORDS[(i * 3 + k) % len(WORDS)] for k in range(5)]
        rows.append((f"o{i}", " ".join(first), " ".join(second), len(set(first) & set(second)) / 5))
    return rows


def write_overlap_file(path: Path, rows, labelled: bool) -> None:
    """The course's layout of a pair file: an unnamed index column, id, the two sentences (and the label)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["", "id", "sentence1", "sentence2", *(["overlap"] if labelled else [])])
        for index, (example_id, first, second, overlap) in enumerate(rows):
            writer.writerow([index, example_id, first, second, *([overlap] if labelled else [])])


@pytest.mark.slow
def test_a_new_kind_of_task_is_one_new_file(tmp_path, tiny_checkpoint):
    repo = copy_of_the_repository(tmp_path / "repo")
    (repo / "minbert" / "tasks" / "overlap.py").write_text(OVERLAP_TASK)
    data = tmp_path / "data"
    data.mkdir()
    write_overlap_file(data / "overlap-train.csv", overlap_rows(16, 0), labelled=True)
    write_overlap_file(data / "overlap-dev.csv", overlap_rows(8, 100), labelled=True)
    write_overlap_file(data / "overlap-test-student.csv", overlap_rows(8, 200), labelled=False)
    environment = os.environ | {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}

    def train(out: Path, *extra) -> str:
        argv = [sys.executable, str(repo / "multitask_classifier.py"), "--tasks", "overlap", "--data_dir", str(data),
                "--pretrained", str(tiny_checkpoint), "--option", "finetune", "--quiet", "--precision", "fp32",
                "--max_length", "16", "--batch_size", "8", "--epochs", "1", "--output_dir", str(out),
                "--overlap_dev_out", str(out / "overlap-dev-out.csv"),
                "--overlap_test_out", str(out / "overlap-test-out.csv"), *map(str, extra)]
        done = subprocess.run(argv, cwd=repo, env=environment, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    teacher = tmp_path / "teacher"
    train(teacher, "--score_train")
    with (teacher / "overlap-dev-out.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["id", "Predicted_Overlap"]
    assert [row[0] for row in rows[1:]] == [example_id for example_id, *_ in overlap_rows(8, 100)]
    assert all(float(row[1]) == float(f"{float(row[1]):.4f}") for row in rows[1:])
    assert (teacher / "overlap-test-out.csv").is_file()
    for split in ("dev", "test", "train"):
        assert (teacher / "scores" / f"overlap-{split}.csv").read_text().splitlines()[0] == "id,overlap"
    assert {"overlap_pearson", "overlap_mse"} <= set(json.loads((teacher / "best.json").read_text())["metrics"])

    student = train(tmp_path / "student", "--distill", teacher)
    assert f"distillation: the train scores of overlap from {teacher}" in student
    assert (tmp_path / "student" / "overlap-test-out.csv").is_file()
