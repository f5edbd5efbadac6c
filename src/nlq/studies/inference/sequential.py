"""Group-sequential tests: boundaries from an alpha-spending function, the probability of crossing them, power and the
expected number of pairs, for a paired comparison looked at after a few pre-set numbers of pairs.

The statistic at look k is Z_k = mean Δ / (sd / sqrt(n_k)); under a true standardised difference θ (Δ / sd per pair)
it is normal with mean θ sqrt(I_k), information I_k = n_k, and Z_1..Z_K have the canonical joint distribution
(independent increments). Crossing probabilities are computed by the recursive numerical integration of Jennison &
Turnbull (2000, Group Sequential Methods with Applications to Clinical Trials, chapter 19; the method of the R
package gsDesign): at each look a grid of about 6r points on the continuation region, Simpson's weights, and the
density carried forward look by look. tests/test_sequential.py holds it to values published from it (gsDesign's
checks of Jennison & Turnbull's tables).

Spending functions, for a two-sided test at alpha that spends a = alpha / 2 on each side (t = the information
fraction n_k / n_K; gsDesign's sfLDOF, sfLDPocock and sfPower, as its symmetric two-sided designs use them):
- `obf`: Lan-DeMets O'Brien-Fleming type, a(t) = 2 - 2 Phi(z_{1-a/2} / sqrt(t));
- `pocock`: Lan-DeMets Pocock type, a(t) = a ln(1 + (e - 1) t);
- `power:RHO`: Kim-DeMets, a(t) = a t^RHO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

R = 18  # grid density (Jennison & Turnbull's r; gsDesign's default)


SPENDING = ("obf", "pocock", "power:RHO")


def spent(spending: str, alpha: float, t: float) -> float:
    """Cumulative two-sided alpha spent by information fraction t in [0, 1] (each side half of it)."""
    t, side = min(max(t, 0.0), 1.0), alpha / 2
    if t == 0:
        return 0.0
    if spending == "obf":
        return 2 * float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - side / 2) / math.sqrt(t)))
    if spending == "pocock":
        return 2 * side * math.log(1 + (math.e - 1) * t)
    if spending.startswith("power:"):
        return 2 * side * t ** float(spending.split(":", 1)[1])
    raise ValueError(f"unknown spending function {spending!r}; use {', '.join(SPENDING)}")


def _grid(mean: float, low: float, high: float, r: int = R) -> tuple[np.ndarray, np.ndarray]:
    """Jennison & Turnbull's grid for a normal of this mean cut to [low, high]: odd-numbered points (finer in the
    middle, spreading out in the tails) with Simpson's rule weights at the midpoints between them."""
    i = np.arange(1, 6 * r)
    x = np.where(i <= r - 1, mean + (-3 - 4 * np.log(r / i)),
                 np.where(i <= 5 * r, mean - 3 + 3 * (i - r) / (2 * r), mean + 3 + 4 * np.log(r / (6 * r - i))))
    x = np.concatenate([[low], x[(x > low) & (x < high)], [high]])
    points = np.empty(2 * len(x) - 1)
    points[0::2], points[1::2] = x, (x[:-1] + x[1:]) / 2
    width = np.diff(x)
    weights = np.zeros_like(points)
    weights[0::2][:-1] += width / 6
    weights[0::2][1:] += width / 6
    weights[1::2] = 4 * width / 6
    return points, weights


def crossing(theta: float, info: list[float], lower: list[float], upper: list[float],
             r: int = R) -> tuple[np.ndarray, np.ndarray]:
    """(P(cross the upper bound first at look k), P(cross the lower bound first at look k)) for k = 1..K, where a
    look continues while lower_k < Z_k < upper_k; theta: the drift per unit of information (mean of Z_k is
    theta sqrt(I_k)). Infinite bounds are allowed."""
    info = np.asarray(info, dtype=float)
    up, down = np.zeros(len(info)), np.zeros(len(info))
    mean = theta * math.sqrt(info[0])
    up[0] = stats.norm.sf(upper[0] - mean)
    down[0] = stats.norm.cdf(lower[0] - mean)
    if len(info) == 1:
        return up, down
    z, w = _grid(mean, max(lower[0], mean - 12), min(upper[0], mean + 12), r)
    h = w * stats.norm.pdf(z - mean)  # weighted density of the continuing Z_1
    for k in range(1, len(info)):
        step = info[k] - info[k - 1]
        shift = z * math.sqrt(info[k - 1]) + theta * step  # mean of Z_k sqrt(I_k) given each grid point
        scale = math.sqrt(step)
        up[k] = float(h @ stats.norm.sf((upper[k] * math.sqrt(info[k]) - shift) / scale))
        down[k] = float(h @ stats.norm.cdf((lower[k] * math.sqrt(info[k]) - shift) / scale))
        if k + 1 < len(info):
            mean = theta * math.sqrt(info[k])
            z_next, w_next = _grid(mean, max(lower[k], mean - 12), min(upper[k], mean + 12), r)
            density = stats.norm.pdf((z_next[:, None] * math.sqrt(info[k]) - shift[None, :]) / scale)
            h = w_next * (density @ h) * math.sqrt(info[k]) / scale
            z = z_next
    return up, down


def spending_bounds(looks: list[int], alpha: float, spending: str) -> list[float]:
    """Two-sided symmetric bounds c_1..c_K (stop when |Z_k| >= c_k) that spend alpha(t_k) - alpha(t_{k-1}) at look
    k under no difference, each side half of it."""
    info, bounds = [float(n) for n in looks], []
    for k in range(len(looks)):
        target = (spent(spending, alpha, info[k] / info[-1]) - spent(spending, alpha, info[k - 1] / info[-1])
                  if k else spent(spending, alpha, info[0] / info[-1])) / 2

        def excess(c: float) -> float:
            up, _ = crossing(0.0, info[:k + 1], [-b for b in bounds] + [-c], bounds + [c])
            return up[k] - target

        bounds.append(float(optimize.brentq(excess, 0.0, 40.0, xtol=1e-10)) if target > 0 else math.inf)
    return bounds


def classical_bounds(looks: list[int], alpha: float, delta: float) -> list[float]:
    """Wang-Tsiatis two-sided bounds c (I_k / I_K)^(delta - 1/2) with one constant c for an overall alpha (delta 0:
    O'Brien-Fleming; 0.5: Pocock)."""
    info = [float(n) for n in looks]
    shape = [(i / info[-1]) ** (delta - 0.5) for i in info]

    def excess(c: float) -> float:
        up, _ = crossing(0.0, info, [-c * s for s in shape], [c * s for s in shape])
        return 2 * up.sum() - alpha

    c = optimize.brentq(excess, 0.5, 20.0, xtol=1e-10)
    return [c * s for s in shape]


@dataclass(frozen=True)
class Operating:
    """What a design does at one true standardised difference θ (Δ / paired sd)."""
    theta: float
    reject: float  # the probability of stopping for a difference (either side) at some look
    stop: list[float]  # the probability of stopping at each look (the last: every path that reaches it)
    expected_pairs: float


def operating(looks: list[int], bounds: list[float], theta: float) -> Operating:
    """Rejection probability, the probability of stopping at each look and the expected number of pairs, for a
    design that stops at the first |Z_k| >= c_k and ends at the last look otherwise."""
    info = [float(n) for n in looks]
    up, down = crossing(theta, info, [-b for b in bounds], bounds)
    crossed = up + down
    stop = list(crossed[:-1]) + [1.0 - float(crossed[:-1].sum())]
    return Operating(theta, float(crossed.sum()), [float(p) for p in stop],
                     float(sum(n * p for n, p in zip(looks, stop))))


def nominal_levels(looks: list[int], alpha: float, spending: str) -> list[float]:
    """Each look's two-sided nominal level p_k = 2 (1 - Phi(c_k)): the bound as a p value, which a paired t test
    with the sd estimated at that look is compared with (the significance-level approach for small samples)."""
    return [float(2 * stats.norm.sf(c)) for c in spending_bounds(looks, alpha, spending)]


def repeated_interval(deltas: list[float], level: float) -> tuple[float, float]:
    """The repeated confidence interval of paired differences at a look's two-sided nominal level: the mean ± the
    t quantile at 1 - level / 2 times the standard error."""
    d = np.asarray(deltas, dtype=float)
    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(len(d))
    half = float(stats.t.ppf(1 - level / 2, len(d) - 1)) * se
    return mean - half, mean + half


def look(deltas: list[float], k: int, looks: list[int], alpha: float, spending: str, margin: float,
         stop_for_equivalence: bool) -> dict:
    """The statistic at look k (0-based) on the first looks[k] pairs and what it decides: 'difference' (the paired t
    test's p at most the look's nominal level), 'equivalence' (the repeated confidence interval at that level inside
    ±margin, when stopping for it is allowed), 'continue', or at the last look 'end'. With the repeated interval
    (Jennison & Turnbull 1989: simultaneous coverage over the looks) and the naive t interval beside it."""
    level = nominal_levels(looks, alpha, spending)[k]
    d = np.asarray(deltas[:looks[k]], dtype=float)  # fewer where a pair left the test (a diverged run)
    n = len(d)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    t = mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    p = float(2 * stats.t.sf(abs(t), n - 1))
    naive = float(stats.t.ppf(0.975, n - 1)) * se
    low, high = repeated_interval(list(d), level)
    if p <= level:
        action = "difference"
    elif stop_for_equivalence and -margin < low and high < margin:
        action = "equivalence"
    else:
        action = "end" if k == len(looks) - 1 else "continue"
    return {"look": k + 1, "pairs": n, "mean": mean, "sd": sd, "t": t, "p": p, "level": level,
            "bound": float(stats.norm.isf(level / 2)), "repeated": [low, high], "naive": [mean - naive, mean + naive],
            "action": action}
