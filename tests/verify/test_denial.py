"""The OSE statistic's interval (`verify.denial.relative_change`): its estimate, pairing, NaN leads, the
too-short error, and the coverage of the default fixed-b interval on autocorrelated per-init series."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import signal

from wxray.errors import DataError
from wxray.verify.denial import relative_change

RESPONSE = np.array([0.1, 0.2, 0.3, 0.4])


def _series(rng, trials: int, n: int, r1: float, cv: float = 0.3):
    """{channel: (trials, n)} baseline and paired denial series, AR(1) in time with lag-1 r1; true change 0.25."""
    def unit(*shape):
        e = rng.standard_normal(shape)
        e[..., 0] /= np.sqrt(1 - r1**2)
        return signal.lfilter([1.0], [1.0, -r1], e, axis=-1) * np.sqrt(1 - r1**2)

    x, y = unit(len(RESPONSE), trials, n), unit(len(RESPONSE), trials, n)
    base = 1 + cv * x
    denied = (1 + RESPONSE[:, None, None]) * (1 + cv * (0.8 * x + 0.6 * y))
    return ({f"c{k}": base[k] for k in range(len(RESPONSE))}, {f"c{k}": denied[k] for k in range(len(RESPONSE))})


def test_estimate_is_the_channel_mean_ratio_of_means_and_lead_zero_without_spread_is_nan():
    base, denied = _series(np.random.default_rng(0), 3, 30, 0.5)
    base["c0"][0], denied["c0"][0] = 0.0, 0.0  # no spread in one channel at one lead: left out of that lead
    iv = relative_change(base, denied)
    with np.errstate(invalid="ignore"):
        expected = np.mean([denied[c].mean(-1) / base[c].mean(-1) for c in base], axis=0) - 1
    np.testing.assert_allclose(iv.estimate[1:], expected[1:], rtol=1e-12)
    np.testing.assert_allclose(iv.estimate[0], np.mean([denied[c][0].mean() / base[c][0].mean() for c in
                                                        ("c1", "c2", "c3")]) - 1, rtol=1e-12)
    zero = {c: np.zeros((1, 30)) for c in base}
    assert np.isnan(relative_change(zero, zero).estimate).all()
    paper = relative_change(base, denied, method="paper", n_resamples=300)
    np.testing.assert_allclose(paper.estimate, iv.estimate, rtol=1e-12)
    assert (iv.lower < iv.estimate).all() and (iv.estimate < iv.upper).all()


def test_too_few_inits_and_mismatched_channels_are_errors():
    base, denied = _series(np.random.default_rng(1), 1, 5, 0.0)
    with pytest.raises(DataError, match=r"OSE intervals \(fixed-b\): 5 init\(s\); need at least 6"):
        relative_change(base, denied)
    relative_change(base, denied, method="paper", n_resamples=200)  # the bootstrap takes 4
    with pytest.raises(DataError, match="the baseline has channels"):
        relative_change(base, {"c0": denied["c0"]})


@pytest.mark.parametrize("n, r1, floor", [(24, 0.0, 0.93), (24, 0.5, 0.93), (60, 0.8, 0.90)])
def test_fixed_b_intervals_hold_their_level_on_autocorrelated_inits(n, r1, floor):
    """Coverage of the true change over 3000 simulated experiments (Monte Carlo sd 0.4 points): the issue's bar
    (>= 93% up to lag-1 0.5, >= 90% at 0.8), met in BENCHMARKS.md section 3 with 10000 per cell."""
    base, denied = _series(np.random.default_rng(int(100 * r1) + n), 3000, n, r1)
    iv = relative_change(base, denied)
    covered = float(np.mean((iv.lower < RESPONSE.mean()) & (RESPONSE.mean() < iv.upper)))
    assert floor <= covered <= 0.975, covered
