"""Group-sequential boundaries and their operating characteristics, held to values published from the standard
method (Jennison & Turnbull 2000, as the R package gsDesign's own checks quote them, and gsDesign's documented
symmetric two-sided Lan-DeMets O'Brien-Fleming design)."""

import math

import pytest
from scipy import optimize, stats

from nlq.studies.inference.sequential import classical_bounds, crossing, operating, spending_bounds, spent

Z975 = stats.norm.ppf(0.975)


@pytest.mark.parametrize("looks, published", [(2, 0.042), (4, 0.063), (10, 0.097), (20, 0.124)])
def test_repeated_testing_at_1_96_crosses_as_published(looks, published):
    """Testing after every group at the unadjusted 1.96 (Armitage, McPherson and Rowe): the chance of ever crossing
    the upper bound under no difference (gsDesign's Deming checks, 3 digits)."""
    up, _ = crossing(0.0, list(range(1, looks + 1)), [-Z975] * looks, [Z975] * looks)
    assert round(float(up.sum()), 3) == published


def test_classical_obrien_fleming_and_wang_tsiatis_bounds_as_published():
    assert [round(b, 2) for b in classical_bounds([1, 2, 3, 4], 0.05, 0.0)] == [4.05, 2.86, 2.34, 2.02]
    assert round(classical_bounds(list(range(1, 10)), 0.05, 0.1)[-1], 3) == 2.113  # JT Table 2.9
    assert round(classical_bounds(list(range(1, 7)), 0.05, 0.25)[-1], 3) == 2.154
    assert round(classical_bounds(list(range(1, 8)), 0.05, 0.4)[-1], 3) == 2.313


def test_lan_demets_obrien_fleming_spending_bounds_as_gsdesign_prints_them():
    """gsDesign(k = 3, test.type = 2, sfu = sfLDOF), alpha 0.025 a side, prints the bounds 3.7103, 2.5114, 1.9930.
    Bounds spend exactly the function at each look, and the whole two-sided alpha."""
    assert [round(b, 4) for b in spending_bounds([1, 2, 3], 0.05, "obf")] == [3.7103, 2.5114, 1.9930]
    bounds = spending_bounds([6, 10, 16], 0.05, "pocock")  # unequal looks, as a plan may set them
    assert operating([6, 10, 16], bounds, 0.0).reject == pytest.approx(0.05, abs=1e-6)
    up, _ = crossing(0.0, [6, 10, 16], [-b for b in bounds], bounds)
    assert 2 * up[0] == pytest.approx(spent("pocock", 0.05, 6 / 16), abs=1e-7)


@pytest.mark.parametrize("looks, rho, max_n, expected", [
    (3, 1, 111.7, [109.9, 103.4, 81.2, 56.5]),
    (10, 2, 108.1, [106.6, 99.7, 76.2, 51.0]),
    (2, 3, 101.0, [100.7, 98.9, 89.5, 70.7]),
])
def test_power_family_designs_match_jennison_and_turnbull_table_7_2(looks, rho, max_n, expected):
    """Symmetric two-sided power-family spending, alpha 0.05, power 0.8: the maximum sample size (% of the fixed
    design's) that keeps the power, and the expected sample size at 0, 0.5, 1 and 1.5 times the planned effect."""
    bounds = spending_bounds(list(range(1, looks + 1)), 0.05, f"power:{rho}")
    fixed = (Z975 + stats.norm.ppf(0.8)) ** 2  # pairs of a fixed design, at a standardised effect of 1

    def info(ratio):
        return [ratio * fixed * k / looks for k in range(1, looks + 1)]

    ratio = optimize.brentq(lambda r: operating(info(r), bounds, 1.0).reject - 0.8, 0.5, 3.0)
    assert round(100 * ratio, 1) == max_n
    found = [round(100 * operating(info(ratio), bounds, f).expected_pairs / fixed, 1) for f in (0, 0.5, 1, 1.5)]
    assert found == expected
    assert math.isclose(operating(info(ratio), bounds, 0.0).reject, 0.05, abs_tol=1e-6)
