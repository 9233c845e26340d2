"""Whether two configurations differ in a figure that each run has once (backward transfer, mean forgetting): the
seeds are the only sample, so the interval is a bootstrap over each arm's runs and the p an exact permutation test
of the difference in means (every way of splitting the pooled runs into groups of the arms' sizes; scipy).

    difference = seed_difference([-0.031, -0.044, -0.035], [-0.051, -0.089, -0.067, -0.116, -0.033])
    difference.value, difference.low, difference.high, difference.p      # mean(a) - mean(b), 95% interval, p

With three runs against five there are C(8, 3) = 56 splits, so p cannot go below 2/56 ≈ 0.036 (two-sided): few
seeds bound how sure any such claim can be, whatever the effect.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minbert.reports.bootstrap import Difference

EXACT_UP_TO = 100_000  # splits enumerated exactly; beyond, scipy draws this many at random


def seed_difference(a: Sequence[float], b: Sequence[float], replicates: int = 2000, seed: int = 0) -> Difference:
    """mean(a) - mean(b) with a 95% interval (each arm's runs drawn with replacement) and the two-sided exact
    permutation p of the difference in means."""
    from scipy.stats import permutation_test  # scipy comes with scikit-learn; imported where it is used
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:  # one run is no sample of seeds
        raise ValueError("each arm needs at least two runs (seeds)")
    generator = np.random.default_rng(seed)
    drawn = (generator.choice(a, (replicates, len(a))).mean(axis=1)
             - generator.choice(b, (replicates, len(b))).mean(axis=1))
    low, high = np.percentile(drawn, [2.5, 97.5])
    test = permutation_test((a, b), lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
                            permutation_type="independent", vectorized=True, n_resamples=EXACT_UP_TO,
                            alternative="two-sided", random_state=seed)
    return Difference(float(a.mean() - b.mean()), float(low), float(high), float(test.pvalue))
