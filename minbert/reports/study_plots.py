"""The thesis' two questions over seeds, as one figure: a figure each run has once (its backward transfer, its kept
model's overall dev score, its STS drop under the embedding attack), one point per run (seed) and arm, beside the
arm's mean with a 95% bootstrap interval over its runs; and, as markdown rows, each arm's difference from the
baseline arm with the exact permutation p over the seeds (seed_tests.py), the test that decides.

    panel = SeedPanel("backward transfer", {"none": [-0.05, -0.09, -0.07], "smart": [-0.03, -0.04, -0.02]})
    plot_seed_panels([panel], "studies.png")
    print("\\n".join(seed_panel_rows(panel, baseline="none")))

Plain numbers in: scripts/plot_studies.py reads them from the committed run folders.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minbert.reports.plots import pyplot, save_figure
from minbert.reports.seed_tests import seed_difference

SEPARABLE_BELOW = 0.05  # the exact test's p under which two arms are called different


@dataclass(frozen=True)
class SeedPanel:
    """One figure's values: arm name -> the figure of each of its runs (seeds), in the order to draw them."""
    title: str
    arms: Mapping[str, Sequence[float]]


def mean_interval(values: Sequence[float], replicates: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The mean of the runs' values and a 95% percentile interval of it, the runs drawn with replacement (as
    seed_tests.seed_difference draws each arm)."""
    values = np.asarray(values, dtype=np.float64)
    drawn = np.random.default_rng(seed).choice(values, (replicates, len(values))).mean(axis=1)
    low, high = np.percentile(drawn, [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def seed_panel_rows(panel: SeedPanel, baseline: str) -> list[str]:
    """A markdown table of the panel: each arm's runs and mean [interval], and every other arm's difference from
    `baseline` with its exact permutation p and the verdict that p gives."""
    lines = [f"**{panel.title}**", "",
             "| arm | runs (per seed) | mean [95% interval] | − " + baseline + " [95% interval] | exact p | verdict |",
             "|---|---|---|---|---|---|"]
    for name, values in panel.arms.items():
        mean, low, high = mean_interval(values)
        runs = ", ".join(f"{value:.3f}" for value in values)
        if name == baseline or baseline not in panel.arms:
            lines.append(f"| {name} | {runs} | {mean:.3f} [{low:.3f}, {high:.3f}] | | | |")
            continue
        d = seed_difference(values, panel.arms[baseline])
        verdict = ("higher" if d.value > 0 else "lower") if d.p < SEPARABLE_BELOW else "not separable"
        lines.append(f"| {name} | {runs} | {mean:.3f} [{low:.3f}, {high:.3f}] | "
                     f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}] | {d.p:.3f} | {verdict} |")
    return lines


def plot_seed_panels(panels: Sequence[SeedPanel], path: str | os.PathLike) -> Path:
    """One panel per SeedPanel, two to a row: each run a small point, each arm's mean a larger one with its 95%
    interval over the runs as a bar."""
    plt = pyplot()
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        for position, (name, values) in enumerate(panel.arms.items()):
            mean, low, high = mean_interval(values)
            offsets = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(1)
            ax.scatter(position - 0.2 + offsets, values, s=14, color="grey", zorder=2)
            ax.errorbar([position + 0.15], [mean], yerr=[[mean - low], [high - mean]], fmt="o", color="black",
                        capsize=4, zorder=3)
        ax.set_xticks(range(len(panel.arms)), list(panel.arms), rotation=30, ha="right")
        ax.set_title(panel.title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)
