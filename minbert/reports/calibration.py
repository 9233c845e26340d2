"""A run's calibration report, from the dev scores of its calibrated tasks (Task.calibrated: SST, QQP) and their gold
labels: a run writes it at its end, scripts/calibrate.py for a finished run from RUN/scores/. The maths is
minbert/tasks/calibration.py's.

    RUN/calibration.json       per task: the dev ECE before and after temperature scaling (fitted on all of dev, and
                               2-fold cross-fitted, the honest figure, with the 95% interval of the ECE it removes), the
                               NLL, the temperature predict.py --calibrated and scripts/ensemble.py --calibrated apply;
                               for a task with a decision threshold (QQP) the threshold chosen on dev, with the dev
                               accuracy at 0 (probability 0.5) and at it, in sample and cross-fitted
    RUN/TASK_reliability.png   its reliability diagram: accuracy against confidence per bin, before and after
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from minbert.files import atomic_write_text
from minbert.reports.plots import pyplot, save_figure
from minbert.tasks import TASKS
from minbert.tasks.base import Task
from minbert.tasks.calibration import (BINS, HALVINGS, bin_sums, bootstrap_interval, calibration_gaps,
                                       calibration_path, confidence_and_correct, expected_calibration_error,
                                       fit_temperature, negative_log_likelihood, out_of_fold, resampled_ece)
from minbert.tasks.calibration import best_threshold as best_logit_threshold


def reliability_file(task: str) -> str:
    """A task's reliability diagram in the run's folder: sst_reliability.png."""
    return f"{task}_reliability.png"


def temperature_figures(task: Task, scores: np.ndarray, gold: np.ndarray, bins: int) -> tuple[dict, list]:
    """Its ECE and NLL before and after temperature scaling, the temperature, and the cross-fitted probabilities of
    each halving of dev (what the diagram draws after)."""
    temperature = fit_temperature(task.outputs.probabilities, scores, gold)
    crossed = out_of_fold(lambda rows: fit_temperature(task.outputs.probabilities, scores[rows], gold[rows]),
                          lambda t, rows: task.outputs.probabilities(scores[rows] / t), len(gold))
    before = calibration_gaps(task.outputs.probabilities(scores), gold, bins)
    after = [calibration_gaps(probabilities, gold, bins) for probabilities in crossed]
    every = np.arange(len(gold))[None]

    def removed(rows: np.ndarray) -> np.ndarray:  # the ECE that cross-fitted temperature scaling removes
        return resampled_ece(before, rows, bins) - np.mean([resampled_ece(gaps, rows, bins) for gaps in after], axis=0)

    accuracy = confidence_and_correct(task.outputs.probabilities(scores), gold)[1].mean()
    return {"temperature": temperature, "accuracy": float(accuracy),
            "ece": float(resampled_ece(before, every, bins)[0]),
            "ece_temperature_in_sample": expected_calibration_error(task.outputs.probabilities(scores / temperature), gold,
                                                                    bins),
            "ece_temperature_cross_fitted": float(np.mean([resampled_ece(gaps, every, bins) for gaps in after])),
            "ece_removed_interval": bootstrap_interval(removed, len(gold)),
            "nll": negative_log_likelihood(task.outputs.probabilities, scores, gold),
            "nll_temperature": negative_log_likelihood(task.outputs.probabilities, scores, gold, temperature)}, crossed


def threshold_figures(task: Task, logits: np.ndarray, gold: np.ndarray) -> dict:
    """The decision threshold chosen on dev, and the dev accuracy at 0 and at it: in sample, and cross-fitted with
    the 95% interval of its gain over 0 (each example's share of right out-of-fold decisions minus its right at 0)."""
    threshold = best_logit_threshold(logits, gold)

    def right(t: float, rows: np.ndarray) -> np.ndarray:
        return task.model.decide_at(torch.from_numpy(logits[rows]), t).numpy() == gold[rows]

    at_zero = right(0.0, np.arange(len(gold)))
    crossed = np.mean(out_of_fold(lambda rows: best_logit_threshold(logits[rows], gold[rows]), right, len(gold)),
                      axis=0)
    gain = crossed - at_zero
    return {"logit": threshold, "probability": float(task.outputs.probabilities(np.array([threshold]))[0, 1]),
            "accuracy_at_0": float(at_zero.mean()),
            "accuracy_in_sample": float(right(threshold, np.arange(len(gold))).mean()),
            "accuracy_cross_fitted": float(crossed.mean()),
            "gain_interval": bootstrap_interval(lambda rows: gain[rows].mean(axis=1), len(gold))}


def task_calibration(task: Task, scores: np.ndarray, gold: np.ndarray, bins: int = BINS) -> tuple[dict, list]:
    """A task's entry of calibration.json from its dev scores (as saved) and gold classes, and the cross-fitted
    probabilities of each halving."""
    gold = np.asarray(gold).astype(int)
    entry, crossed = temperature_figures(task, scores, gold, bins)
    entry = {"examples": len(gold), **entry}
    if task.has_threshold:
        entry["threshold"] = threshold_figures(task, scores, gold)
    return entry, crossed


def plot_reliability(title: str, before: np.ndarray, after: np.ndarray, gold: np.ndarray, entry: dict, bins: int,
                     path: str | os.PathLike) -> Path:
    """Accuracy against mean confidence per bin, before and after temperature scaling (the first halving's
    cross-fitted probabilities), above the bins' example counts."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": (3, 1)})
    top.plot([0, 1], [0, 1], color="grey", linestyle=":", label="calibrated")
    edges = np.linspace(0, 1, bins + 1)
    for probabilities, label, marker in ((before, "as trained", "o"),
                                         (after, f"T = {entry['temperature']:.2f}, cross-fitted", "s")):
        counts, confidence, correct = bin_sums(*confidence_and_correct(probabilities, gold), bins)
        used = counts > 0
        top.plot(confidence[used] / counts[used], correct[used] / counts[used], marker=marker, label=label)
        bottom.stairs(counts, edges, label=label)
    top.set_ylabel("accuracy")
    top.set_title(f"{title} dev: ECE {entry['ece']:.3f} -> {entry['ece_temperature_cross_fitted']:.3f} "
                  f"({bins} bins)")
    top.legend(loc="upper left")
    bottom.set_xlabel("confidence (top class probability)")
    bottom.set_ylabel("examples")
    return save_figure(fig, path)


def write_calibration(run_dir: str | os.PathLike, dev: Mapping[str, tuple[np.ndarray, np.ndarray]],
                      bins: int = BINS) -> dict:
    """calibration.json and the reliability diagrams of the calibrated tasks of `dev` (task -> (scores as saved,
    gold)) in run_dir, each with at least two dev examples (two halves to cross-fit); the report written ({} and
    nothing written when no task qualifies)."""
    report = {"bins": bins, "halvings": HALVINGS, "tasks": {}}
    for name, (scores, gold) in dev.items():
        task = TASKS[name]
        if not task.calibrated or len(gold) < 2:  # cross-fitting needs two halves
            continue
        entry, crossed = task_calibration(task, scores, gold, bins)
        report["tasks"][name] = entry
        plot_reliability(task.title, task.outputs.probabilities(scores), crossed[0], np.asarray(gold).astype(int), entry,
                         bins, Path(run_dir) / reliability_file(name))
    if not report["tasks"]:
        return {}
    atomic_write_text(calibration_path(run_dir), json.dumps(report, indent=1) + "\n")
    return report


def calibration_lines(report: dict) -> list[str]:
    """A line per task of the report: ECE and temperature, and the threshold's dev accuracy."""
    lines = []
    for name, entry in report.get("tasks", {}).items():
        low, high = entry["ece_removed_interval"]
        line = (f"{TASKS[name].title} dev ECE ({report['bins']} bins) {entry['ece']:.4f} -> "
                f"{entry['ece_temperature_cross_fitted']:.4f} at T = {entry['temperature']:.3f} (2-fold "
                f"cross-fitted; removed 95% CI [{low:.4f}, {high:.4f}]; fitted on all of dev: "
                f"{entry['ece_temperature_in_sample']:.4f})")
        threshold = entry.get("threshold")
        if threshold:
            low, high = threshold["gain_interval"]
            line += (f"; threshold logit {threshold['logit']:.3f} (p {threshold['probability']:.3f}): dev acc "
                     f"{threshold['accuracy_at_0']:.4f} at 0.5 -> {threshold['accuracy_cross_fitted']:.4f} "
                     f"cross-fitted (gain 95% CI [{low:.4f}, {high:.4f}]; in sample "
                     f"{threshold['accuracy_in_sample']:.4f})")
        lines.append(line)
    return lines
