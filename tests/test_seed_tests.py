"""minbert/reports/seed_tests.py: a difference over seeds, its bootstrap interval and its exact permutation p."""
import math

import pytest

from minbert.reports.seed_tests import seed_difference


def test_completely_separated_arms_get_the_smallest_p_the_splits_allow():
    # 3 against 5 runs: 56 splits, the observed one and its mirror are the two as extreme (two-sided)
    difference = seed_difference([3.0, 3.1, 3.2], [1.0, 1.1, 1.2, 1.3, 1.4])
    assert difference.value == pytest.approx(3.1 - 1.2)
    assert difference.p == pytest.approx(2 / math.comb(8, 3))
    assert difference.separable and difference.low > 0


def test_identical_arms_are_not_separable():
    runs = [0.1, 0.2, 0.3]
    difference = seed_difference(runs, runs)
    assert difference.value == 0 and difference.p == pytest.approx(1.0) and not difference.separable


def test_the_interval_is_a_bootstrap_over_each_arms_runs():
    a, b = [1.0, 2.0, 3.0], [0.0, 0.0]
    difference = seed_difference(a, b, replicates=4000)
    assert difference.low >= 1.0 - 1e-12 and difference.high <= 3.0 + 1e-12  # means of draws of a, less 0
    assert difference.low < 2.0 < difference.high
    assert seed_difference([5.0, 5.0], [1.0, 1.0]).low == seed_difference([5.0, 5.0], [1.0, 1.0]).high == 4.0


@pytest.mark.parametrize("a, b", [([], [1.0, 2.0]), ([1.0], [1.0, 2.0])])
def test_an_arm_of_fewer_than_two_runs_is_refused(a, b):
    with pytest.raises(ValueError, match="at least two runs"):
        seed_difference(a, b)
