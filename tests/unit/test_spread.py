"""The moderated spread's arithmetic: special functions against reference values (SciPy
1.17.1's scipy.special and scipy.stats.t, computed once; SciPy is not a dependency), and
the empirical-Bayes prior on spreads that are alike and unlike."""

from __future__ import annotations

import math
import random

import pytest

from latencyd.tools import spread as S


@pytest.mark.parametrize(
    ("x", "psi", "psi1"),
    [
        (0.3, -3.502524222200133, 12.245364546107734),
        (1.0, -0.5772156649015329, math.pi**2 / 6),
        (7.5, 1.9467574842460866, 0.1426158966967038),
    ],
)
def test_digamma_and_trigamma(x: float, psi: float, psi1: float) -> None:
    assert S.digamma(x) == pytest.approx(psi, rel=1e-10)
    assert S.trigamma(x) == pytest.approx(psi1, rel=1e-10)
    assert S.trigamma_inverse(psi1) == pytest.approx(x, rel=1e-9)


@pytest.mark.parametrize(
    ("q", "dof", "t"),
    [
        (0.975, 4.0, 2.7764451051977934),
        (1 - 0.05 / 24, 5.3, 4.805283502015236),
        (1 - 0.05 / 24, 1.7, 22.56557315887931),
        (0.9, 100.0, 1.290074761346516),
        (0.975, math.inf, 1.959963984540054),
    ],
)
def test_student_t_quantile(q: float, dof: float, t: float) -> None:
    assert S.t_quantile(q, dof) == pytest.approx(t, rel=1e-9)
    if math.isfinite(dof):
        assert S.t_cdf(t, dof) == pytest.approx(q, rel=1e-12)
        assert S.t_cdf(-t, dof) == pytest.approx(1 - q, rel=1e-9)


def _spreads(sds: list[float], rounds: int = 3, seed: int = 5) -> list[S.Spread]:
    rng = random.Random(seed)
    return [S.Spread.of([20 * math.exp(rng.gauss(0, sd)) for _ in range(rounds)]) for sd in sds]


def test_scenarios_that_spread_alike_pool_into_one_figure() -> None:
    prior = S.fit_prior(_spreads([0.1] * 40))
    assert prior is not None
    assert prior.dof > 20  # or infinite: nothing to moderate
    assert math.sqrt(prior.variance) == pytest.approx(0.1, rel=0.3)
    sd, dof = S.moderated(prior, *_spreads([0.5, 0.5]))
    # a comparison's own wide rounds barely move a figure backed by so many scenarios
    assert sd < 0.2 and dof > 20


def test_scenarios_that_spread_unlike_keep_their_own_spread() -> None:
    prior = S.fit_prior(_spreads([0.03] * 20 + [1.0] * 20))
    assert prior is not None and prior.dof < 5
    steady = _spreads([0.03, 0.03], seed=9)
    sd, dof = S.moderated(prior, *steady)
    pooled = math.sqrt(sum(s.squares for s in _spreads([0.03] * 20 + [1.0] * 20)) / 80)
    assert sd < pooled / 2  # two steady scenarios are judged by a steadier figure ...
    assert dof == pytest.approx(prior.dof + 4)  # ... with a margin for its few rounds


def test_too_few_spreads_give_no_prior() -> None:
    assert S.fit_prior([S.Spread.of([5.0]), S.Spread.of([5.0, 5.0])]) is None
    assert S.Spread.of([1.0, math.nan, -1.0]) == S.Spread(0.0, 0)
