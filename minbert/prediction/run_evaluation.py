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

from minbert.data.batches import TaskData, subsample
from minbert.files import atomic_write_text
from minbert.prediction.inference import Predictor
from minbert.prediction.leaderboard import overall_of, summarize_line
from minbert.step_log import RunLog
from minbert.tasks import MULTITASK, RUN_TASKS, TASKS

# The console's line of a stage: its place, then each default task's metrics (tables' columns), the overall score
# and each other task's.
SUMMARY_KEYS = ("index", "stage", "train_loss", "seconds", "eval_seconds",
                *(key for task in MULTITASK for key, _ in TASKS[task].model.history_columns), "overall",
                *(key for task in RUN_TASKS if task not in MULTITASK for key, _ in TASKS[task].model.history_columns))
# A record holding this key, with N (--max_eval_examples N), has the dev metrics of a fixed subset of at most N dev
# examples per task (drawn from --seed, the same every stage); a record without it, those of every dev example.
SUBSET_KEY = "dev_subset"
# In a stage's record, with train_loss: what is not a dev metric.
STAGE_FIELDS = ("seconds", "eval_seconds", "fp16_skipped_updates", SUBSET_KEY)
METRICS_FILE = "metrics.jsonl"


class Evaluator:
    """Every task's metrics on a split of the run's data, and the predictions and scores they come from.
    `seed`: the draw of a split's examples that evaluate(..., limit) scores."""

    def __init__(self, predictor: Predictor, data: dict[str, TaskData], seed: int):
        self.predictor, self.data, self.seed = predictor, data, seed
        # The metrics of the last dev evaluation: the decision settings chosen there (SQuAD's no-answer threshold),
        # which the other splits' predictions use.
        self.chosen: dict = {}

    def evaluate(self, split: str = "dev", limit: int | None = None) -> tuple[dict, dict]:
        """Metrics of every task on a split, and (ids, predictions, gold labels) per task."""
        metrics, predictions, _ = self.evaluate_with_scores(split, limit)
        return metrics, predictions

    def evaluate_with_scores(self, split: str = "dev", limit: int | None = None,
                             chosen: dict | None = None) -> tuple[dict, dict, dict]:
        """evaluate's metrics and predictions, and per task the scores they were decided from (tasks.base's
        TaskEvaluation). The decision settings are those of the dev metrics `chosen` if given (a kept model's), else
        chosen afresh by a dev evaluation (SQuAD's no-answer threshold, to maximise its F1) and kept for the other
        splits."""
        reused = chosen if chosen is not None else (None if split == "dev" else self.chosen)
        metrics, predictions, scores = {}, {}, {}
        for task, data in self.data.items():
            examples = getattr(data, split)
            if examples is None:
                continue
            evaluation = TASKS[task].model.evaluate(self.predictor, subsample(examples, limit, self.seed), reused)
            metrics.update(evaluation.metrics)
            predictions[task], scores[task] = evaluation.predictions, evaluation.scores
        if all(TASKS[task].model.score_key in metrics for task in MULTITASK):
            metrics["overall"] = overall_of(metrics)
        if split == "dev" or chosen is not None:  # settings chosen now, or the kept model's: they hold from now on
            self.chosen = metrics
        return metrics, predictions, scores


def stage_record(label: str, index: int, train_loss: float, seconds: float, dev_metrics: dict,
                 fp16_skipped_updates: int | None = None, train_metrics: dict | None = None,
                 eval_seconds: float | None = None) -> dict:
    """A stage's record in the history: its label and number (its history index), its mean train loss, its training
    seconds (`seconds`: training only, as records have always had them), the seconds of its evaluation after it and
    its dev metrics; fp16's skipped updates so far in the run (None: not fp16) and, with --eval_train_examples, the
    train metrics as train_NAME."""
    record = {"stage": label, "index": index, "train_loss": train_loss, "seconds": seconds,
              **({"eval_seconds": eval_seconds} if eval_seconds is not None else {}), **dev_metrics}
    if fp16_skipped_updates is not None:
        record["fp16_skipped_updates"] = fp16_skipped_updates
    record.update({f"train_{k}": v for k, v in (train_metrics or {}).items()})
    return record


def stage_scalars(record: dict) -> dict:
    """A stage record's values by TensorBoard tag: dev/NAME for the dev metrics, stage/NAME for the rest (the train
    loss, seconds, fp16's skipped updates and --eval_train_examples' train_ metrics)."""
    return {f"{'stage' if name in STAGE_FIELDS or name.startswith('train_') else 'dev'}/{name}": value
            for name, value in record.items() if name not in ("stage", "index")}


def kept_record_mismatch(kept: dict, history: list[dict]) -> str | None:
    """Why `kept` (best.json's metrics: the kept model's stage record) is not the record of its stage in `history`
    (the run's history.json), or None. Both files are written from one record, so every value agrees exactly; but a
    stage scored on a dev subset (SUBSET_KEY) has the full dev's metrics in best.json (Trainer.score_full_dev), and
    then only the fields that are no dev metric can."""
    index = kept.get("index")
    record = next((record for record in history if record.get("index") == index), None)
    if record is None:
        return f"history.json has no stage {index}"
    if SUBSET_KEY in record:  # score_full_dev drops the subset's size too
        keys = [key for key in record if (key in ("stage", "index", *STAGE_FIELDS) and key != SUBSET_KEY)
                or key.startswith("train_")]
    else:
        keys = list({**record, **kept})
    differing = next((key for key in keys if key not in kept or key not in record or kept[key] != record[key]), None)
    return None if differing is None else f"history.json's stage {index} differs in {differing}"


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
            atomic_write_text(self.output_dir / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in history))
