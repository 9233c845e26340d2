"""The calibration of a classification task's dev probabilities, computed from the scores a run saves (RUN/scores/),
so that a finished run is calibrated as well as a run at its end:

    expected calibration error (ECE)   top-label, BINS equal-width confidence bins [k/B, (k+1)/B) (the last closed):
                                       sum over bins of |bin| / N x |accuracy - mean confidence| (Guo et al. 2017)
    temperature scaling                one T > 0 per task, the logits divided by it, fitted on dev by minimising the
                                       negative log-likelihood (a golden-section search of log T: the NLL is convex in
                                       1 / T, so it has one minimum along log T)
    decision threshold                 a one-logit task (QQP): the logit t (1 where logit > t) of the highest dev
                                       accuracy; among equally accurate ones the nearest to 0, the 0.5 rule

A temperature or threshold fitted on dev and scored on the same dev set is optimistic. The honest figures are
cross-fitted: dev split at random into halves, fitted on one half and scored on the other, both ways, over HALVINGS
random halvings; their 95% intervals are a bootstrap over the dev examples (the fits held fixed). The run's
calibration.json holds them (reports/calibration.py writes it, read_calibration reads it back for predict.py and
scripts/ensemble.py).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from minbert.tasks.score_files import ScoresFileError

BINS = 15  # Guo et al. 2017's bin count
HALVINGS = 5  # random halvings of dev whose cross-fitted figures are averaged
REPLICATES = 1000  # bootstrap replicates of a difference's interval
CHUNK = 50  # replicates drawn at once: QQP's 20,000 dev examples x 50 stay a few MB per array
TEMPERATURE_RANGE = (0.05, 20.0)  # where the search looks: beyond, the probabilities are all 0 / 1 or all uniform
CALIBRATION_FILE = "calibration.json"

Probabilities = Callable[[np.ndarray], np.ndarray]  # a task's saved scores (logits) -> (N, C) class probabilities


def confidence_and_correct(probabilities: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top class's probability and whether it is the gold one, per example ((N,) each)."""
    return probabilities.max(axis=-1), probabilities.argmax(axis=-1) == gold


def bin_index(confidence: np.ndarray, bins: int = BINS) -> np.ndarray:
    """Each confidence's bin: [k/B, (k+1)/B), a confidence of 1 in the last."""
    return np.minimum((confidence * bins).astype(int), bins - 1)


def bin_sums(confidence: np.ndarray, correct: np.ndarray, bins: int = BINS) -> np.ndarray:
    """(3, bins): each bin's example count, confidence sum and correct count."""
    index = bin_index(confidence, bins)
    return np.stack([np.bincount(index, minlength=bins), np.bincount(index, confidence, bins),
                     np.bincount(index, correct.astype(float), bins)])


def calibration_gaps(probabilities: np.ndarray, gold: np.ndarray, bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """Each example's bin and its correct (1 / 0) minus confidence: what an ECE sums per bin."""
    confidence, correct = confidence_and_correct(probabilities, gold)
    return bin_index(confidence, bins), correct - confidence


def resampled_ece(gaps: tuple[np.ndarray, np.ndarray], rows: np.ndarray, bins: int = BINS) -> np.ndarray:
    """The ECE of the examples of each row of `rows` (R, M) indices, from their calibration_gaps, in one bincount:
    (R,)."""
    index, gap = gaps
    sums = np.bincount((index[rows] + bins * np.arange(len(rows))[:, None]).ravel(), gap[rows].ravel(),
                       len(rows) * bins)
    return np.abs(sums).reshape(len(rows), bins).sum(axis=1) / rows.shape[1]


def expected_calibration_error(probabilities: np.ndarray, gold: np.ndarray, bins: int = BINS) -> float:
    """ECE of (N, C) class probabilities against the gold classes."""
    return float(resampled_ece(calibration_gaps(probabilities, gold, bins), np.arange(len(gold))[None], bins)[0])


def negative_log_likelihood(probabilities: Probabilities, scores: np.ndarray, gold: np.ndarray,
                            temperature: float = 1.0) -> float:
    """The mean NLL of the gold classes under the scores divided by `temperature`."""
    with np.errstate(over="ignore", under="ignore"):  # a sigmoid of a large logit: exp overflows to the right 0 / 1
        chosen = probabilities(scores / temperature)[np.arange(len(gold)), gold]
    return float(-np.log(np.clip(chosen, 1e-300, None)).mean())


def fit_temperature(probabilities: Probabilities, scores: np.ndarray, gold: np.ndarray) -> float:
    """The T in TEMPERATURE_RANGE of the lowest NLL of the gold classes, to about 1e-6 of log T."""
    low, high = (math.log(t) for t in TEMPERATURE_RANGE)
    ratio = (math.sqrt(5) - 1) / 2

    def loss(log_t: float) -> float:
        return negative_log_likelihood(probabilities, scores, gold, math.exp(log_t))

    left, right = high - ratio * (high - low), low + ratio * (high - low)
    left_loss, right_loss = loss(left), loss(right)
    while high - low > 1e-6:
        if left_loss <= right_loss:
            high, right, right_loss = right, left, left_loss
            left = high - ratio * (high - low)
            left_loss = loss(left)
        else:
            low, left, left_loss = left, right, right_loss
            right = low + ratio * (high - low)
            right_loss = loss(right)
    return math.exp((low + high) / 2)


def best_threshold(logits: np.ndarray, gold: np.ndarray) -> float:
    """The logit threshold t (predict 1 where logit > t) of the highest accuracy on (logits, gold): 0 or a midpoint
    between two neighbouring logits (or one beyond them all); among equally accurate ones the nearest to 0."""
    values = np.unique(logits)
    candidates = np.concatenate([[0.0, values[0] - 1.0, values[-1] + 1.0], (values[:-1] + values[1:]) / 2])
    order = np.argsort(logits, kind="stable")
    negatives_below = np.concatenate([[0], np.cumsum(gold[order] == 0)])  # negatives among the k lowest logits
    below = np.searchsorted(logits[order], candidates, side="right")  # how many logits are <= each candidate
    correct = negatives_below[below] + (np.sum(gold == 1) - (below - negatives_below[below]))
    best = np.flatnonzero(correct == correct.max())
    return float(candidates[best[np.argmin(np.abs(candidates[best]))]])


def halvings(size: int, repeats: int = HALVINGS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The two halves of each of `repeats` seeded random halvings of range(size)."""
    for seed in range(repeats):
        order = np.random.default_rng(seed).permutation(size)
        yield order[: size // 2], order[size // 2:]


def out_of_fold(fit: Callable[[np.ndarray], object], apply: Callable[[object, np.ndarray], np.ndarray],
                size: int) -> list[np.ndarray]:
    """Per halving, every example's value from a fit on the other half: apply(fit(rows of one half), rows of the
    other), both ways, in the examples' order."""
    values = []
    for first, second in halvings(size):
        filled = None
        for fit_on, score_on in ((first, second), (second, first)):
            part = np.asarray(apply(fit(fit_on), score_on))
            if filled is None:
                filled = np.empty((size, *part.shape[1:]), dtype=part.dtype)
            filled[score_on] = part
        values.append(filled)
    return values


def bootstrap_interval(statistic: Callable[[np.ndarray], np.ndarray], size: int,
                       replicates: int = REPLICATES) -> list[float]:
    """The 95% percentile interval of a statistic over `replicates` resamplings of range(size) (seed 0):
    statistic((R, size) row indices) gives each row's value, (R,); drawn CHUNK rows at a time."""
    rng = np.random.default_rng(0)
    values = np.concatenate([statistic(rng.integers(0, size, (min(CHUNK, replicates - start), size)))
                             for start in range(0, replicates, CHUNK)])
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


# -- the run's calibration.json ------------------------------------------------------------------------

def calibration_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CALIBRATION_FILE


def read_calibration(run_dir: str | os.PathLike) -> dict[str, dict]:
    """The calibrated tasks of a run's calibration.json, by name, each checked to hold a positive finite
    "temperature" and, where it has one, a finite "threshold" {"logit": t}. ScoresFileError naming the file."""
    path = calibration_path(run_dir)
    if not path.is_file():
        raise ScoresFileError(f"{path}: no such file; a run writes it at its end, scripts/calibrate.py RUN "
                              "--data_dir DIR for a finished run")
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))["tasks"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ScoresFileError(f"{path}: not a calibration file ({type(err).__name__}: {err})") from None
    if not isinstance(tasks, dict) or not all(isinstance(entry, dict) for entry in tasks.values()):
        raise ScoresFileError(f"{path}: its \"tasks\" must map each task to its figures")
    for name, entry in tasks.items():
        temperature = entry.get("temperature")
        if not (type(temperature) in (int, float) and math.isfinite(temperature) and temperature > 0):
            raise ScoresFileError(f"{path}: {name}'s temperature must be a number > 0, found {temperature!r}")
        threshold = entry.get("threshold", {"logit": 0.0})
        logit = threshold.get("logit") if isinstance(threshold, dict) else None
        if not (type(logit) in (int, float) and math.isfinite(logit)):
            raise ScoresFileError(f"{path}: {name}'s threshold must be {{\"logit\": a number}}, found {threshold!r}")
    return tasks
