"""The run's model evaluated on its splits, and the records of those evaluations: each task's metrics (SQuAD's with
the no-answer threshold chosen on dev), one record per stage in the history, and where the records go
(metrics.jsonl, the console's summary line, TensorBoard's stage scalars).

    evaluator = Evaluator(predictor, data, seed)
    metrics, predictions, scores = evaluator.evaluate_with_scores("dev")
    metrics_log.write(stage_record(stage.label, index + 1, train_loss, seconds, metrics), updates)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from datasets import TaskData, subsample
from evaluation import overall_score, summarize_line, task_metrics
from inference import Predictor, decide
from squad import best_threshold, qa_metrics
from step_log import RunLog
from tasks import TASKS

SUMMARY_KEYS = ("index", "stage", "train_loss", "seconds", "sst_acc", "sst_f1_weighted", "qqp_acc", "qqp_f1_weighted",
                "sts_pearson", "sts_spearman", "overall", "qa_f1")
STAGE_FIELDS = ("seconds", "fp16_skipped_updates")  # in a stage's record, with train_loss: what is not a dev metric
METRICS_FILE = "metrics.jsonl"


class Evaluator:
    """Every task's metrics on a split of the run's data, and the predictions and scores they come from.
    `seed`: the draw of a split's examples that evaluate(..., limit) scores."""

    def __init__(self, predictor: Predictor, data: dict[str, TaskData], seed: int):
        self.predictor, self.data, self.seed = predictor, data, seed
        self.qa_threshold = 0.0  # SQuAD's no-answer threshold, chosen on dev at every dev evaluation

    def evaluate(self, split: str = "dev", limit: int | None = None) -> tuple[dict, dict]:
        """Metrics of every task on a split, and (ids, predictions, gold labels) per task."""
        metrics, predictions, _ = self.evaluate_with_scores(split, limit)
        return metrics, predictions

    def evaluate_with_scores(self, split: str = "dev", limit: int | None = None,
                             qa_threshold: float | None = None) -> tuple[dict, dict, dict]:
        """evaluate's metrics and predictions, and (ids, scores) per task: the scores they were decided from.
        SQuAD's no-answer threshold is `qa_threshold` if given, else chosen on dev to maximise F1 (and kept
        for other splits); its predictions and scores are the questions' answers (squad.Answer by id)."""
        metrics, predictions, scores = {}, {}, {}
        for task, data in self.data.items():
            examples = getattr(data, split)
            if examples is None:
                continue
            examples = subsample(examples, limit, self.seed)
            if TASKS[task].is_extractive:
                answers = self.predictor.answer(examples)
                if qa_threshold is not None:
                    self.qa_threshold = qa_threshold
                elif split == "dev":
                    self.qa_threshold = best_threshold(answers, examples)
                metrics.update(qa_metrics(answers, examples, self.qa_threshold))
                predictions[task] = scores[task] = answers
                continue
            ids, task_scores = self.predictor.predict(task, examples, scores=True)
            predicted = decide(self.predictor.model, task, task_scores)
            gold = np.array([e.label for e in examples])
            predictions[task], scores[task] = (ids, predicted, gold), (ids, task_scores)
            metrics.update(task_metrics(task, predicted, gold))
        if {"sst_acc", "qqp_acc", "sts_pearson"} <= metrics.keys():
            metrics["overall"] = overall_score(metrics["sst_acc"], metrics["qqp_acc"], metrics["sts_pearson"])
        return metrics, predictions, scores


def stage_record(label: str, index: int, train_loss: float, seconds: float, dev_metrics: dict,
                 fp16_skipped_updates: int | None = None, train_metrics: dict | None = None) -> dict:
    """A stage's record in the history: its label and number (its history index), its mean train loss, its training
    seconds and its dev metrics; fp16's skipped updates so far in the run (None: not fp16) and, with
    --eval_train_examples, the train metrics as train_NAME."""
    record = {"stage": label, "index": index, "train_loss": train_loss, "seconds": seconds, **dev_metrics}
    if fp16_skipped_updates is not None:
        record["fp16_skipped_updates"] = fp16_skipped_updates
    record.update({f"train_{k}": v for k, v in (train_metrics or {}).items()})
    return record


def stage_scalars(record: dict) -> dict:
    """A stage record's values by TensorBoard tag: dev/NAME for the dev metrics, stage/NAME for the rest (the train
    loss, seconds, fp16's skipped updates and --eval_train_examples' train_ metrics)."""
    return {f"{'stage' if name in STAGE_FIELDS or name.startswith('train_') else 'dev'}/{name}": value
            for name, value in record.items() if name not in ("stage", "index")}


class MetricsLog:
    """Where the history's records go on the main process (`active`): a summary line on the console, a line of
    OUTPUT_DIR/metrics.jsonl, and the run log's stage scalars."""

    def __init__(self, output_dir: Path, run_log: RunLog, active: bool = True):
        self.output_dir, self.run_log, self.active = Path(output_dir), run_log, active

    def write(self, record: dict, updates: int) -> None:
        """One record, after `updates` updates of the run."""
        if not self.active:
            return
        print(summarize_line({k: record[k] for k in SUMMARY_KEYS if k in record}))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / METRICS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        self.run_log.scalars(stage_scalars(record), updates)
        self.run_log.flush()

    def rewrite(self, history: list[dict]) -> None:
        """metrics.jsonl as a resumed checkpoint's history: a kill between a stage's line and its checkpoint leaves a
        record the checkpoint does not have, and the checkpoint's history is the truth."""
        if self.active:
            (self.output_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in history),
                                                        encoding="utf-8")
