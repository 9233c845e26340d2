"""What a study may conclude from its tests: one primary comparison, declared before the table, decided by the exact
permutation test over seeds (seed_tests.py); every other comparison the study prints is secondary, a family whose p
values are Holm-corrected (Holm 1979) before any of them is called separable.

    adjusted = holm([0.01, 0.04, 0.03, 0.005])      # [0.03, 0.06, 0.06, 0.02]
    secondary_verdict(0.03, separable=True)         # "not separable" unless the adjusted p is below ALPHA
    parse_primary("smart:bwt", ["none", "smart"])   # ("smart", "bwt"); without "ARM:" the second arm

Why: a study that prints twenty differences finds one at p < 0.05 by chance; naming the comparison that decides
before looking, and correcting the rest for their number, keeps "separable" meaning what it says.
"""
from __future__ import annotations

from collections.abc import Sequence

ALPHA = 0.05  # the level of every decision, primary and (after Holm's correction) secondary


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p values, in the order given: the i-th smallest of m (from 0) times m - i,
    never below the one before it in that order (so the adjusted values keep the raw ones' order), at most 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def secondary_verdict(adjusted_p: float, separable: bool) -> str:
    """'survives' when the Holm-adjusted p is below ALPHA and the interval holds no zero, else 'not separable'."""
    return "survives" if separable and adjusted_p < ALPHA else "not separable"


def parse_primary(text: str, arms: Sequence[str]) -> tuple[str, str]:
    """--primary [ARM:]FIGURE -> (ARM, FIGURE): ARM one of the later arms (the second arm when not named); ValueError
    saying what is wrong. The figure is the text after the last colon (figures have none, arm names may)."""
    arm, colon, figure = text.rpartition(":")
    if len(arms) < 2:
        raise ValueError("--primary: a comparison needs two arms or more")
    arm = arm if colon else arms[1]
    if arm not in arms[1:]:
        raise ValueError(f"--primary: {arm!r} is not one of the later arms ({', '.join(arms[1:])})")
    if not figure:
        raise ValueError(f"--primary: {text!r} names no figure")
    return arm, figure
