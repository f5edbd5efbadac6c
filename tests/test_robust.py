"""The exploratory readings of a plan report: the Hodges-Lehmann estimate and its exact interval, the count of runs far
above an arm's median, and Wortsman et al.'s lr sensitivity, each against a computation written out here."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from nlq.studies.inference.stats import far_above, hodges_lehmann, signed_rank_counts
from nlq.studies.reports.plan_robust import lr_sensitivity


def test_the_signed_rank_distribution_is_the_enumerated_one():
    n = 7
    sums = [sum(r for r, bit in zip(range(1, n + 1), format(mask, f"0{n}b")) if bit == "1") for mask in range(2 ** n)]
    assert signed_rank_counts(n) == [sums.count(t) for t in range(n * (n + 1) // 2 + 1)]


def test_hodges_lehmann_is_the_median_of_the_walsh_averages_and_its_interval_inverts_the_signed_rank_test():
    d = list(np.random.default_rng(3).normal(0.02, 0.03, size=16))
    hl = hodges_lehmann(d, 0.95)
    walsh = [(a + b) / 2 for i, a in enumerate(d) for b in d[i:]]
    assert hl["estimate"] == pytest.approx(float(np.median(walsh)))
    assert 0.95 <= hl["level"] < 0.97
    eps = 1e-9  # a shift just inside each bound is not rejected at 5%, just outside it is
    for theta, rejected in ((hl["low"] + eps, False), (hl["high"] - eps, False),
                            (hl["low"] - eps, True), (hl["high"] + eps, True)):
        p = stats.wilcoxon([x - theta for x in d], method="exact").pvalue
        assert (p <= 0.05) == rejected, (theta, p)


def test_hodges_lehmann_gives_no_interval_where_the_pairs_are_too_few():
    assert math.isnan(hodges_lehmann([0.1, 0.2, 0.3, 0.4, 0.5])["low"])  # 5 pairs: P(T+ = 0) = 1/32 > 2.5%
    six = hodges_lehmann([0.3, 0.1, 0.2, 0.6, 0.5, 0.4])
    assert (six["low"], six["high"], six["level"]) == (0.1, 0.6, 1 - 2 / 64)


def test_far_above_counts_only_the_upper_tail_beyond_three_scaled_mads():
    values = [1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.30, 0.70]
    assert far_above(values) == [6]  # 0.70 is as far below: not a tail above
    assert far_above([1.0, 1.0, 1.0, 2.0]) == []  # no spread to scale by: nothing is called far


def test_lr_sensitivity_is_the_mean_excess_over_the_best_lr_and_counts_a_diverged_run_at_the_cap():
    s = SimpleNamespace(selection_seeds=[1, 2], lrs=[1e-3, 2e-3, 4e-3], confidence=0.95, endpoint="full_val_loss",
                        primary=["a", "b"])
    picked = {("a", 1e-3, 1): 3.2, ("a", 1e-3, 2): 3.4, ("a", 2e-3, 1): 3.0, ("a", 2e-3, 2): 3.0,
              ("a", 4e-3, 1): 3.1, ("a", 4e-3, 2): None,  # diverged: counts as the cap, 5.0
              ("b", 1e-3, 1): 3.1, ("b", 1e-3, 2): 3.1, ("b", 2e-3, 1): 3.0, ("b", 2e-3, 2): 3.0,
              ("b", 4e-3, 1): 3.05, ("b", 4e-3, 2): 3.05}
    lines, rows = lr_sensitivity(picked, s, ["a", "b"], cap=5.0)
    # a: best 2e-3; seed 1: (3.2 + 3.0 + 3.1) / 3 - 3.0 = 0.1; seed 2: (3.4 + 3.0 + 5.0) / 3 - 3.0 = 0.8
    assert rows["a"]["best_lr"] == 2e-3 and rows["a"]["sensitivity"] == pytest.approx(0.45)
    assert rows["b"]["sensitivity"] == pytest.approx(0.05)
    assert rows["b"]["vs_baseline"]["mean"] == pytest.approx(0.05 - 0.45)
    assert rows["a"]["excess"] == pytest.approx({"0.001": 0.3, "0.002": 0.0, "0.004": 1.05})
    assert any("Lr sensitivity (a reading of the selection stage" in line for line in lines)
