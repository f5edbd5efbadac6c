"""The statistics of the reports: paired t intervals, the equivalence test (TOST), Holm's adjustment, a
pre-registered decision rule, and the power computations behind a study's number of pairs.

Pure functions of lists of numbers; tests check them against hand computations and scipy's own tests.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
from scipy import integrate, stats


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan for fewer than two values)."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else math.nan


def median(values: list[float]) -> float:
    """The median; for an even count, the mean of the two middle values."""
    return statistics.median(values)


def paired_difference(arm: list[float], baseline: list[float], confidence: float = 0.95) -> dict:
    """Mean of per-seed differences (arm - baseline) with a two-sided t interval, its p value against 0 and
    a verdict ('better': the interval lies below 0, 'worse': above, else 'within noise')."""
    d = np.asarray(arm, dtype=float) - np.asarray(baseline, dtype=float)
    n = len(d)
    mean = float(d.mean())
    if n < 2:
        return {"n": n, "mean": mean, "low": math.nan, "high": math.nan, "p": math.nan,
                "verdict": "one seed: no interval"}
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / math.sqrt(n))
    low, high = mean - half, mean + half
    se = float(d.std(ddof=1) / math.sqrt(n))
    p = float(2 * stats.t.sf(abs(mean) / se, n - 1)) if se > 0 else (0.0 if mean else 1.0)
    verdict = "better" if high < 0 else "worse" if low > 0 else "within noise"
    return {"n": n, "mean": mean, "sd": float(d.std(ddof=1)), "low": low, "high": high, "p": p, "verdict": verdict}


def equivalence_test(differences: list[float], margin: float, alpha: float = 0.05) -> dict:
    """Two one-sided t tests (TOST) that the mean difference lies inside (-margin, +margin): H0 mean <= -margin
    (p_lower) and H0 mean >= +margin (p_upper). Equivalence is shown when both are rejected at alpha, i.e. when
    the 1 - 2 alpha interval (low, high) lies inside the margins."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n < 2:
        return {"p_lower": math.nan, "p_upper": math.nan, "p": math.nan, "low": math.nan, "high": math.nan,
                "equivalent": False}
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    if se == 0:  # every difference the same: each one-sided test rejects exactly when the mean is inside
        p_lower, p_upper = float(mean <= -margin), float(mean >= margin)
    else:
        p_lower = float(stats.t.sf((mean + margin) / se, n - 1))
        p_upper = float(stats.t.cdf((mean - margin) / se, n - 1))
    half = float(stats.t.ppf(1 - alpha, n - 1) * se)
    return {"p_lower": p_lower, "p_upper": p_upper, "p": max(p_lower, p_upper), "low": mean - half,
            "high": mean + half, "equivalent": max(p_lower, p_upper) < alpha}


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p values (same order as given): the k-th smallest is
    multiplied by (m - k + 1), made non-decreasing, capped at 1. nan stays nan and does not count in m."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m, running = len(indexed), 0.0
    adjusted = [math.nan] * len(p_values)
    for k, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - k) * p))
        adjusted[i] = running
    return adjusted


def holm_verdicts(tests: list[dict], alpha: float = 0.05) -> list[dict]:
    """Each paired_difference of a family with its Holm-adjusted p ('p_holm') and the verdict at that level:
    'better' or 'worse' (by the sign of the mean) where p_holm < alpha, else 'within noise'; a test without an
    interval keeps its own verdict."""
    adjusted = holm([t["p"] for t in tests])
    out = []
    for test, p_holm in zip(tests, adjusted):
        if math.isnan(p_holm):
            out.append(test | {"p_holm": p_holm})
            continue
        verdict = ("better" if test["mean"] < 0 else "worse") if p_holm < alpha else "within noise"
        out.append(test | {"p_holm": p_holm, "verdict": verdict})
    return out


VERDICTS = {
    "better": "nonlinear better",  # a plan's method stands for "nonlinear" (decide's method)
    "worse": "nonlinear worse",
    "equivalent": "no effect of the paper's size",
    "inconclusive": "inconclusive",
}


def decide(differences: list[float], margin: float, confidence: float = 0.95, alpha: float = 0.05,
           method: str = "nonlinear", equivalent_words: str | None = None,
           directions: tuple[str, str] = ("better", "worse")) -> dict:
    """The pre-registered decision on paired differences (arm - baseline): the confidence interval below 0
    is 'better', above 0 'worse'; otherwise equivalence within +-margin (TOST at alpha) is 'equivalent'
    (equivalent_words say it, VERDICTS' by default); else 'inconclusive'. directions: the words for a Δ below and
    above 0 (an endpoint in steps: "earlier", "later"). Returns the interval, the equivalence test, the verdict key
    and its words."""
    interval = paired_difference(differences, [0.0] * len(differences), confidence)
    tost = equivalence_test(differences, margin, alpha)
    if interval["high"] < 0:
        key = "better"
    elif interval["low"] > 0:
        key = "worse"
    elif tost["equivalent"]:
        key = "equivalent"
    else:
        key = "inconclusive"
    words = verdict_words(key, method, equivalent_words, directions)
    if key in ("better", "worse") and tost["equivalent"]:
        words += f", by less than {margin:g} (equivalence within ±{margin:g} also shown)"
    return {"interval": interval, "tost": tost, "verdict": key, "words": words}


def verdict_words(key: str, method: str, equivalent_words: str | None = None,
                  directions: tuple[str, str] = ("better", "worse")) -> str:
    """A decision's words for its verdict key."""
    if key == "equivalent":
        return equivalent_words or VERDICTS[key]
    if key in ("better", "worse"):
        return f"{method} {directions[key == 'worse']}"
    return VERDICTS[key]


def sd_interval(sd: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The confidence interval of a normal sample's sd (n values), from the chi-square distribution of its variance."""
    df, tail = n - 1, (1 - confidence) / 2
    return sd * math.sqrt(df / stats.chi2.ppf(1 - tail, df)), sd * math.sqrt(df / stats.chi2.ppf(tail, df))


def power_paired_t(effect: float, sd: float, n: int, confidence: float = 0.95) -> float:
    """Power of the two-sided paired t test (at 1 - confidence) to find a true mean difference `effect`."""
    if sd == 0:  # no noise: any true difference is found
        return 1.0 if effect else 1 - confidence
    df, noncentrality = n - 1, effect / (sd / math.sqrt(n))
    critical = stats.t.ppf(0.5 + confidence / 2, df)
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.cdf(-critical, df, noncentrality))


def pairs_needed(effect: float, sd: float, power: float = 0.8, confidence: float = 0.95,
                 most: int = 10_000) -> int | None:
    """The fewest pairs whose paired t test finds a true difference `effect` with this power (None beyond most)."""
    for n in range(3, most + 1):
        if power_paired_t(effect, sd, n, confidence) >= power:
            return n
    return None


def power_equivalence(true: float, sd: float, n: int, margin: float, alpha: float = 0.05) -> float:
    """Power of the equivalence test (TOST at alpha, margins +-margin) when the true mean difference is `true`:
    the probability that the 1 - 2 alpha interval lies inside the margins, integrated over the sample sd."""
    df, se = n - 1, sd / math.sqrt(n)
    critical = stats.t.ppf(1 - alpha, df)

    def inside(x: float) -> float:  # x: the chi-square variable of the sample variance
        half = critical * sd * math.sqrt(x / df) / math.sqrt(n)
        if half >= margin:
            return 0.0
        both = stats.norm.cdf((margin - half - true) / se) - stats.norm.cdf((-margin + half - true) / se)
        return max(0.0, both) * stats.chi2.pdf(x, df)

    x_max = df * (margin * math.sqrt(n) / (critical * sd)) ** 2  # beyond it the interval is wider than the margins
    return float(integrate.quad(inside, 0.0, x_max, limit=200)[0])


def relative_delta(baseline: float, arm: float) -> float:
    """(variant - baseline) / baseline: the sign of Δ = variant - baseline, positive means the variant is higher
    (worse); the one convention of every report (the paper's -1.24% and -2.40% are in it)."""
    return (arm - baseline) / baseline


def fit_loss_vs_params(params: list[float], losses: list[float]) -> tuple[float, float] | None:
    """Least-squares loss = a + b ln(N); None when the fit is impossible or loss does not fall with N."""
    if len(set(params)) < 2:
        return None
    b, a = np.polyfit(np.log(np.asarray(params, dtype=float)), np.asarray(losses, dtype=float), 1)
    return (float(a), float(b)) if b < 0 else None


def equivalent_params(fit: tuple[float, float], loss: float) -> float:
    """N at which the fitted baseline family reaches `loss`."""
    a, b = fit
    return math.exp((loss - a) / b)


def signed_rank_counts(n: int) -> list[int]:
    """The number of subsets of {1..n} with each rank sum 0..n(n+1)/2: the exact null distribution of Wilcoxon's
    signed-rank statistic T+ (without ties), times 2^n."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    return counts


def hodges_lehmann(differences: list[float], confidence: float = 0.95) -> dict:
    """The Hodges-Lehmann estimate of a paired shift (the median of the n(n+1)/2 Walsh averages (d_i + d_j) / 2,
    i <= j) with its exact distribution-free interval: the Walsh averages of ranks k and M - k + 1, k the largest
    with P(T+ < k) <= (1 - confidence) / 2 under the signed-rank null (Hollander, Wolfe and Chicken, Nonparametric
    Statistical Methods, 3rd ed., section 3.3). Robust to a few pairs far off: the exploratory beside the t interval.
    Its coverage is at least `confidence` (the achieved level is returned); nan bounds where n is too small."""
    d = sorted(float(x) for x in differences)
    n = len(d)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))
    estimate = float(np.median(walsh)) if walsh else math.nan
    counts = signed_rank_counts(n)
    total, alpha = 2 ** n, 1 - confidence
    k, tail = 0, 0
    while k < len(counts) and (tail + counts[k]) / total <= alpha / 2:  # P(T+ <= k) <= alpha/2: k + 1 is safe
        tail += counts[k]
        k += 1
    if k == 0:
        return {"n": n, "estimate": estimate, "low": math.nan, "high": math.nan, "level": math.nan}
    return {"n": n, "estimate": estimate, "low": walsh[k - 1], "high": walsh[len(walsh) - k],
            "level": 1 - 2 * tail / total}


def hodges_lehmann_pairs(confidence: float = 0.95) -> int:
    """The fewest pairs whose Hodges-Lehmann interval can exist at this confidence: where even the most extreme signed-
    rank outcome, probability 2 / 2^n, is at most 1 - confidence (6 pairs at 95%)."""
    n = 1
    while 2 / 2 ** n > 1 - confidence:
        n += 1
    return n


def far_above(values: list[float], mads: float = 3.0) -> list[int]:
    """Indices of the values more than `mads` scaled median absolute deviations (MAD x 1.4826, the sd of a normal
    sample) above the median: a robust count of a long upper tail, which the mean and sd hide."""
    if len(values) < 3:
        return []
    middle = float(np.median(values))
    scale = 1.4826 * float(np.median([abs(v - middle) for v in values]))
    return [i for i, v in enumerate(values) if scale > 0 and v - middle > mads * scale]
