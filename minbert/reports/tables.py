"""The numbers a run's reports show, without plotting: the stage history as a table (the forgetting table) with its
continual-learning figures, and error counts for the three multitask tasks; plots.py draws them, evaluation.py gives
the course's names.
"""

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from minbert.prediction.leaderboard import overall_of
from minbert.tasks import MULTITASK, RUN_TASKS, TASKS
from minbert.tasks.metrics import paired_arrays, paraphrase_metrics

# (history key, human label) for the columns of forgetting tables and plots: each default task's own score, then
# the overall score.
HISTORY_METRICS = (*(TASKS[task].model.history_columns[0] for task in MULTITASK), ("overall", "overall"))
# Columns of their own when every entry has them: the default tasks' other metrics (the thesis' weighted F1s and
# STS's Spearman; histories written before they were computed lack them), then the score of each other task a run
# may train (SQuAD's F1, --tasks ...,qa).
OPTIONAL_HISTORY_METRICS = (*(column for task in MULTITASK for column in TASKS[task].model.history_columns[1:]),
                            *(TASKS[task].model.history_columns[0] for task in RUN_TASKS if task not in MULTITASK))
# The score of each task in the continual-learning figures (forgetting_measures): its own dev metric on its own
# scale, accuracy for SST and QQP, Pearson r for STS (not the overall score's (r + 1) / 2), F1 for SQuAD.
TASK_SCORES = {task: TASKS[task].model.score_key for task in RUN_TASKS}
# The stage label of the history's first record: the model before any training (minbert/training/trainer.py).
BEFORE_TRAINING = "pretrained"
# The label of a multi-task epoch's stage, 'multitask-2' (schedules.Stage.label writes the labels a history holds;
# tests/test_schedules.py reads each kind of label back).
MULTITASK_STAGE_PREFIX = "multitask-"


def history_matrix(history: Sequence[Mapping]) -> tuple[list[str], list[str], np.ndarray]:
    """Row labels ('0. pretrained', '1. qqp', ...: each record's "index", the stage number the trainer prints, its
    position where a record has none), column names and a (stages, metrics) matrix of dev metrics: HISTORY_METRICS,
    then each of OPTIONAL_HISTORY_METRICS that every entry has.

    'overall' is derived from the three task metrics when an entry does not carry it.
    """
    if not history:
        raise ValueError("history is empty; nothing to tabulate")
    keys = [key for key, _ in HISTORY_METRICS[:-1]]  # the default tasks' scores; the last column is the overall one
    labels, rows = [], []
    for position, entry in enumerate(history, start=1):
        index = entry.get("index", position)  # the stage's number as the trainer prints it; 0 the pretrained model
        stage = entry.get("stage", f"stage {index}")
        for key in keys:
            if key not in entry:
                raise ValueError(f"history entry {position} ({stage}) lacks {key!r}")
        labels.append(f"{index}. {stage}")
        rows.append([*(entry[key] for key in keys), entry.get("overall", overall_of(entry))])
    names = [name for _, name in HISTORY_METRICS]
    for key, name in OPTIONAL_HISTORY_METRICS:
        if all(key in entry for entry in history):
            names.append(name)
            rows = [row + [entry[key]] for row, entry in zip(rows, history)]
    return labels, names, np.array(rows, dtype=float)


def forgetting_table_markdown(history: Sequence[Mapping]) -> str:
    """Markdown table stage × metric, closed by a 'forgetting' row = best-ever minus final, then the
    continual-learning figures of history_forgetting_measures where the schedule has them.

    A forgetting of 0 means the final model is as good as the best stage on that metric.
    """
    labels, names, matrix = history_matrix(history)
    lines = ["| stage | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, row in zip(labels, matrix):
        lines.append(f"| {label} | " + " | ".join(f"{v:.4f}" for v in row) + " |")
    forgetting = matrix.max(axis=0) - matrix[-1]
    lines.append("| forgetting (best − final) | " + " | ".join(f"{v:.4f}" for v in forgetting) + " |")
    measures = history_forgetting_measures(history)
    if measures is not None:
        lines += ["", *measures.markdown_lines()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ForgettingMeasures:
    """The standard continual-learning figures of a forgetting matrix R, R[l, i] = the score of task i after
    stage l (rows in training order, T the last), over the *earlier* tasks: those a stage before T trained and
    stage T did not (the tasks i < T of a schedule that trains each task once; a task trained several times is
    measured from the last stage that trained it, s_i).

    average_score: A_T, the mean over every task (columns) of its score after the last stage.
    backward_transfer: BWT (Lopez-Paz & Ranzato 2017), the mean over the earlier tasks of R[T, i] - R[s_i, i]:
        negative when later stages lowered what a task had reached when it was last trained.
    forgetting: per earlier task, f_i (Chaudhry et al. 2018), the max over the rows before the last,
        l < T, of R[l, i] - R[T, i]: how far the final model is below the task's best before it (negative
        when the last stage raised the task above every earlier score).
    """
    tasks: tuple[str, ...]
    average_score: float
    backward_transfer: float
    forgetting: dict[str, float]

    @property
    def average_forgetting(self) -> float:
        return float(np.mean(list(self.forgetting.values())))

    def markdown_lines(self) -> list[str]:
        scores = ", ".join(TASK_SCORES[task] for task in self.tasks)
        earlier = ", ".join(self.forgetting)
        per_task = ", ".join(f"{task} {value:.4f}" for task, value in self.forgetting.items())
        return [f"Continual-learning figures over the stages (task scores {scores}; the model before training is "
                "not a row):",
                f"- average score after the last stage: {self.average_score:.4f}",
                f"- backward transfer (Lopez-Paz & Ranzato 2017) over {earlier}: {self.backward_transfer:.4f}",
                f"- forgetting (Chaudhry et al. 2018): {per_task}; mean {self.average_forgetting:.4f}"]


def forgetting_measures(scores, tasks: Sequence[str],
                        trained: Sequence[Collection[str]]) -> ForgettingMeasures | None:
    """ForgettingMeasures of the forgetting matrix `scores` (stages × tasks; row l: each task's score after
    stage l), whose columns are `tasks` and whose stage l trained the tasks `trained[l]`.

    None when no task is an earlier one (a single stage; a multi-task schedule, whose every stage trains every
    task): without a task that later stages could take something from, BWT and forgetting are undefined.
    """
    matrix = np.asarray(scores, dtype=float)
    if matrix.shape != (len(trained), len(tasks)):
        raise ValueError(f"scores of shape {matrix.shape}, but {len(trained)} stages and {len(tasks)} tasks")
    last = len(trained) - 1
    last_trained = {task: max(l for l, stage in enumerate(trained) if task in stage)
                    for task in tasks if any(task in stage for stage in trained)}
    earlier = [i for i, task in enumerate(tasks) if task in last_trained and last_trained[task] < last]
    if not earlier:
        return None
    final = matrix[last]
    transfer = [final[i] - matrix[last_trained[tasks[i]], i] for i in earlier]
    return ForgettingMeasures(
        tasks=tuple(tasks), average_score=float(final.mean()), backward_transfer=float(np.mean(transfer)),
        forgetting={tasks[i]: float(matrix[:last, i].max() - final[i]) for i in earlier})


def history_forgetting_measures(history: Sequence[Mapping]) -> ForgettingMeasures | None:
    """forgetting_measures of a run's history: one row per stage record (not the record of the model before
    training: the rows l of Chaudhry et al.'s max are stages), a column per task whose TASK_SCORES key every row
    has, each stage's trained tasks read from its label."""
    stages = [record for record in history if record.get("stage") != BEFORE_TRAINING]
    tasks = [task for task, key in TASK_SCORES.items() if stages and all(key in record for record in stages)]
    if not tasks:
        return None
    scores = [[record[TASK_SCORES[task]] for task in tasks] for record in stages]
    return forgetting_measures(scores, tasks, [tasks_trained_by(record["stage"], tasks) for record in stages])


def tasks_trained_by(label: str, tasks: Iterable[str]) -> set[str]:
    """The tasks among `tasks` whose heads the stage named `label` (Stage.label, as a run's history records it)
    trained: its own for a task stage ('qqp', 'qqp@0.03'), every one for a multi-task epoch ('multitask-2'), none
    for 'mlm', 'simcse' or the history's record of the model before training."""
    if label.startswith(MULTITASK_STAGE_PREFIX):
        return set(tasks)
    return {label.partition("@")[0]} & set(tasks)


def error_counts(sst_pred, sst_gold, para_pred, para_gold, sts_pred, sts_gold) -> dict:
    """The counts the error-analysis plots draw, as numbers: SST examples per (predicted − gold) offset,
    the QQP confusion matrix with precision and recall of the duplicate class, and per gold STS bin
    ([0, 1), …, [4, 5]) the number of pairs, their mean prediction and mean absolute error."""
    sst_p, sst_g = paired_arrays(sst_pred, sst_gold)
    para_p, para_g = paired_arrays(para_pred, para_gold)
    sts_p, sts_g = paired_arrays(sts_pred, sts_gold)
    offsets = Counter((sst_p - sst_g).astype(int).tolist())
    paraphrase_metrics(para_p, para_g)  # validates the 0/1 values counted below
    true_pos = int(np.sum((para_p == 1) & (para_g == 1)))
    false_pos = int(np.sum((para_p == 1) & (para_g == 0)))
    false_neg = int(np.sum((para_p == 0) & (para_g == 1)))
    bins = []
    for low in range(5):
        # the last bin is closed: gold 5.0 belongs to [4, 5]
        inside = (sts_g >= low) & ((sts_g < low + 1) if low < 4 else (sts_g <= 5))
        if inside.any():
            bins.append({"gold": f"[{low}, {low + 1}{')' if low < 4 else ']'}", "pairs": int(inside.sum()),
                         "mean_prediction": float(sts_p[inside].mean()),
                         "mean_abs_error": float(np.abs(sts_p[inside] - sts_g[inside]).mean())})
    return {
        "sst_offsets": {offset: offsets.get(offset, 0) for offset in range(-4, 5)},
        "qqp": {"true_negatives": int(np.sum((para_p == 0) & (para_g == 0))), "false_positives": false_pos,
                "false_negatives": false_neg, "true_positives": true_pos,
                "precision": true_pos / (true_pos + false_pos) if true_pos + false_pos else 0.0,
                "recall": true_pos / (true_pos + false_neg) if true_pos + false_neg else 0.0},
        "sts_bins": bins,
        "sts_mean_prediction": float(sts_p.mean()), "sts_mean_gold": float(sts_g.mean()),
    }
