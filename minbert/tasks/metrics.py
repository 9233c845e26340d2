"""The metrics of the tasks' predictions: accuracy and F1 of classes, Pearson and Spearman correlations of scores.
Plain numpy, no model: prediction/leaderboard.py and the reports read them too.
"""
import warnings

import numpy as np


def paired_arrays(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(predictions, dtype=float).reshape(-1)
    gold = np.asarray(labels, dtype=float).reshape(-1)
    if pred.shape != gold.shape:
        raise ValueError(f"{pred.size} predictions but {gold.size} labels")
    if pred.size == 0:
        raise ValueError("cannot compute metrics on zero examples")
    return pred, gold


def _f1_per_class(pred: np.ndarray, gold: np.ndarray, cls: float) -> float:
    true_pos = np.sum((pred == cls) & (gold == cls))
    predicted = np.sum(pred == cls)
    actual = np.sum(gold == cls)
    # F1 = 2TP / (predicted + actual); a class absent from both scores 0, as in scikit-learn.
    return 0.0 if predicted + actual == 0 else float(2 * true_pos / (predicted + actual))


def _f1_macro_and_weighted(pred: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    """Macro and support-weighted F1 over the classes seen in either input. The class set is the union of
    predicted and gold labels (scikit-learn's convention), so a class the model predicts but never occurs in the
    gold data drags the macro F1 down (its weight, a gold support of 0, keeps it out of the weighted F1)."""
    classes = np.union1d(pred, gold)
    f1 = np.array([_f1_per_class(pred, gold, c) for c in classes])
    support = np.array([np.sum(gold == c) for c in classes])
    return float(np.mean(f1)), float(np.sum(f1 * support) / support.sum())


def sst_metrics(predictions, labels) -> dict[str, float]:
    """Accuracy plus macro and support-weighted F1 (the thesis' SST figures: accuracy and weighted F1)."""
    pred, gold = paired_arrays(predictions, labels)
    f1_macro, f1_weighted = _f1_macro_and_weighted(pred, gold)
    return {"acc": float(np.mean(pred == gold)), "f1_macro": f1_macro, "f1_weighted": f1_weighted}


def paraphrase_metrics(predictions, labels) -> dict[str, float]:
    """Accuracy, F1 of the positive (is-paraphrase) class, and the support-weighted F1 of both classes (the
    thesis' QQP F1, as for SST); inputs must be 0/1."""
    pred, gold = paired_arrays(predictions, labels)
    for name, values in (("predictions", pred), ("labels", gold)):
        if not np.isin(values, (0.0, 1.0)).all():
            raise ValueError(f"paraphrase {name} must be 0 or 1 (threshold probabilities first)")
    return {"acc": float(np.mean(pred == gold)), "f1": _f1_per_class(pred, gold, 1.0),
            "f1_weighted": _f1_macro_and_weighted(pred, gold)[1]}


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks (scipy.stats.rankdata's "average")."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = np.arange(1, len(values) + 1)
    _, groups, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(groups, weights=ranks)
    return sums[groups] / counts[groups]


def sts_metrics(predictions, labels) -> dict[str, float]:
    """Pearson and Spearman correlations between predicted and gold similarity scores (papers report both;
    Spearman is Pearson's r of the average ranks, so it rewards the right order whatever the scale).

    Both are undefined when either side is constant (zero variance); a collapsed model
    does exactly that early in training, so they are reported as 0.0 (no relation)
    with a RuntimeWarning instead of NaN, which would poison the overall score.
    """
    pred, gold = paired_arrays(predictions, labels)
    if np.ptp(pred) == 0 or np.ptp(gold) == 0:
        side = "predictions" if np.ptp(pred) == 0 else "labels"
        warnings.warn(f"STS {side} are constant; Pearson and Spearman r reported as 0.0", RuntimeWarning,
                      stacklevel=2)
        return {"pearson": 0.0, "spearman": 0.0}
    return {"pearson": float(np.corrcoef(pred, gold)[0, 1]),
            "spearman": float(np.corrcoef(average_ranks(pred), average_ranks(gold))[0, 1])}
