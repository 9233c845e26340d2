"""minbert/reports/decisions.py: Holm's step-down correction against hand-computed values, its ties and bounds, the
secondary verdict at the boundary, and --primary's [ARM:]FIGURE."""
import pytest

from minbert.reports.decisions import ALPHA, holm, parse_primary, secondary_verdict


@pytest.mark.parametrize("raw, adjusted", [
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> 0.06 (never below the one before)
    ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),
    ([0.02, 0.02, 0.5], [0.06, 0.06, 0.5]),  # a tie: both 0.02 * 3, the second not lowered to 0.02 * 2
    ([0.4, 0.6], [0.8, 0.8]),  # 0.6 * 1 would fall below 0.4 * 2: kept at 0.8
    ([0.6, 0.7], [1.0, 1.0]),  # capped at 1
    ([0.3], [0.3]),  # a family of one is not corrected
    ([], []),
])
def test_holm_matches_hand_computed_values(raw, adjusted):
    assert holm(raw) == pytest.approx(adjusted)


def test_holm_keeps_the_raw_order_and_never_lowers_a_p():
    raw = [0.2, 0.001, 0.049, 0.01, 0.02, 0.5, 0.0]
    adjusted = holm(raw)
    assert all(a >= r for a, r in zip(adjusted, raw))
    ranked = sorted(range(len(raw)), key=lambda i: raw[i])
    assert [adjusted[i] for i in ranked] == sorted(adjusted)


def test_a_secondary_comparison_survives_below_alpha_with_an_interval_without_zero():
    assert secondary_verdict(ALPHA - 1e-9, separable=True) == "survives"
    assert secondary_verdict(ALPHA, separable=True) == "not separable"  # p < 0.05, not <=
    assert secondary_verdict(0.001, separable=False) == "not separable"


def test_primary_names_a_later_arm_and_a_figure():
    arms = ["none", "smart", "a:b"]
    assert parse_primary("bwt", arms) == ("smart", "bwt")  # the second arm when not named
    assert parse_primary("a:b:bwt", arms) == ("a:b", "bwt")  # an arm's name may hold a colon: the figure may not
    for text, problem in [("none:bwt", "'none' is not one of the later arms (smart, a:b)"),
                          ("lnsr:bwt", "'lnsr' is not one of the later arms"), ("smart:", "names no figure")]:
        with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            parse_primary(text, arms)
    with pytest.raises(ValueError, match="needs two arms or more"):
        parse_primary("bwt", ["none"])
