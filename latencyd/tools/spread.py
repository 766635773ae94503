"""How much a latency percentile varies between rounds of the same scenario, when the
scenarios do not all vary alike.

Attribution has few rounds per scenario (3) and many scenarios (up to 24). Pooling every
scenario's spread into one figure assumes they all spread alike; under load they do not:
a scenario without the shield is bimodal (a CPU hog lands on the measured CPU in some
rounds and not in others) while a shielded one is steady, and the bimodal ones set a bar
the steady ones can never clear. The textbook answer for few replicates of many parallel
comparisons whose variances differ is empirical Bayes moderation (Smyth 2004, the limma
package's moderated t): the scenarios' variances are taken as drawn from a scaled
inverse chi-square distribution whose scale s0² and degrees of freedom d0 are fitted to
them all; each scenario's own variance is then shrunk towards s0² with weight d0, and a
comparison's margin is Student t's at the combined degrees of freedom. With no excess
spread between scenarios (d0 infinite) it is the pooled figure and the normal margin.

Pure arithmetic over logs of the percentiles, with the special functions it needs (the
standard library has none of them; nothing else in latencyctl needs scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist


def digamma(x: float) -> float:
    """ψ(x) for x > 0: recurrence up to 10, then the asymptotic series."""
    out = 0.0
    while x < 10.0:
        out -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    return out + math.log(x) - 0.5 / x - f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f / 240)))


def trigamma(x: float) -> float:
    """ψ'(x) for x > 0: recurrence up to 10, then the asymptotic series."""
    out = 0.0
    while x < 10.0:
        out += 1.0 / (x * x)
        x += 1.0
    f = 1.0 / (x * x)
    return out + 1 / x + 0.5 * f + f / x * (1 / 6 - f * (1 / 30 - f * (1 / 42 - f / 30)))


def trigamma_inverse(y: float) -> float:
    """The x > 0 with trigamma(x) = y (y > 0): trigamma falls strictly, so bisect on
    log x; 200 halvings of [1e-12, 1e12] leave far less than a double's rounding."""
    lo, hi = math.log(1e-12), math.log(1e12)
    for _ in range(200):
        mid = (lo + hi) / 2
        if trigamma(math.exp(mid)) > y:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            out *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return out


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    """Student t's distribution function at `dof` degrees of freedom (any dof > 0)."""
    tail = 0.5 * incomplete_beta(dof / 2, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, dof: float) -> float:
    """Student t's quantile (0.5 <= q < 1); the normal's where dof is infinite."""
    if math.isinf(dof):
        return NormalDist().inv_cdf(q)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < q:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, dof) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Prior:
    """What the scenarios' variances of log(percentile) say together: their scale s0²
    and how many degrees of freedom that is worth (infinite: they all spread alike)."""

    variance: float
    dof: float


@dataclass(frozen=True)
class Spread:
    """One scenario's spread: its sum of squares about its mean and degrees of freedom."""

    squares: float
    dof: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        logs = [math.log(v) for v in values if math.isfinite(v) and v > 0]
        if len(logs) < 2:
            return cls(0.0, 0)
        mean = sum(logs) / len(logs)
        return cls(sum((x - mean) ** 2 for x in logs), len(logs) - 1)


def fit_prior(spreads: Sequence[Spread]) -> Prior | None:
    """s0² and d0 from the scenarios' variances, by the method of moments on their logs
    (limma's fitFDist): the mean and the excess variance of log s², each corrected for
    what a variance with d degrees of freedom spreads by itself. None with fewer than
    two scenarios that vary at all."""
    usable = [(s.squares / s.dof, s.dof) for s in spreads if s.dof and s.squares > 0]
    if len(usable) < 2:
        return None
    e = [math.log(v) - digamma(d / 2) + math.log(d / 2) for v, d in usable]
    mean = sum(e) / len(e)
    excess = sum((x - mean) ** 2 for x in e) / (len(e) - 1)
    excess -= sum(trigamma(d / 2) for _, d in usable) / len(usable)
    if excess <= 0:  # no more spread between scenarios than chance gives: all alike
        return Prior(math.exp(mean), math.inf)
    dof = 2 * trigamma_inverse(excess)
    return Prior(math.exp(mean + digamma(dof / 2) - math.log(dof / 2)), dof)


def moderated(prior: Prior, a: Spread, b: Spread) -> tuple[float, float]:
    """The standard deviation of log(percentile) for a comparison of scenarios a and b,
    their own spreads shrunk towards the prior, and its degrees of freedom."""
    if math.isinf(prior.dof):
        return math.sqrt(prior.variance), math.inf
    dof = prior.dof + a.dof + b.dof
    return math.sqrt((prior.dof * prior.variance + a.squares + b.squares) / dof), dof
