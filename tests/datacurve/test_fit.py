"""The curve arithmetic of `plan data`, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from draftsmith.datacurve.fit import (
    Measurement,
    bootstrap_fits,
    compare_methods,
    fit_curve,
    fit_power_law,
    measured_tau,
    predict_with_interval,
    smallest_size_reaching,
    support_limit,
    tau_of_positions,
)


def test_an_exact_power_law_is_recovered():
    sizes = [100, 200, 400, 800]
    values = [4.0 - 6.0 * n ** -0.5 for n in sizes]  # 3.4, 3.576, 3.7, 3.788
    curve = fit_power_law(sizes, values)
    assert (curve.plateau, curve.scale, curve.exponent) == pytest.approx((4.0, 6.0, 0.5), rel=1e-9)
    assert float(curve(3200)) == pytest.approx(4.0 - 6.0 / 3200 ** 0.5)


def test_a_curve_that_falls_is_read_as_flat_at_its_mean():
    curve = fit_power_law([10, 20, 40], [3.0, 2.5, 2.0])
    assert curve.scale == 0.0
    assert curve.plateau == pytest.approx(2.5)


def test_the_plateau_never_passes_its_upper_bound():
    curve = fit_power_law([10, 20, 40, 80], [0.5, 0.8, 0.95, 0.99], upper=1.0)
    assert curve.plateau <= 1.0
    assert float(curve(1e9)) <= 1.0


def test_tau_of_positions_caps_each_position_by_the_one_before():
    # Position 2 cannot be accepted more often than position 1: 0.7 counts as 0.5.
    assert float(tau_of_positions(np.array([0.5, 0.7]))) == pytest.approx(2.0)
    assert float(tau_of_positions(np.array([0.9, 0.6, 0.3]))) == pytest.approx(2.8)


def test_a_measurement_shares_accepted_drafts_over_all_cycles_of_its_prompts():
    item = Measurement(size=8, seed=0, cycles=np.array([10.0, 30.0]), accepted=np.array([[5.0, 2.0], [15.0, 10.0]]))
    assert item.positions().tolist() == pytest.approx([0.5, 0.3])
    assert item.positions(np.array([0, 0])).tolist() == pytest.approx([0.5, 0.2])


def test_the_smallest_size_reaching_a_tau_inverts_the_curve():
    # tau = 4 - 6 n^-0.5 reaches 3.9 at n = (6 / 0.1)^2 = 3600.
    sizes = [100, 200, 400, 800]
    measurements = [_exact(size, lambda n: 4.0 - 6.0 * n ** -0.5) for size in sizes]
    fit = fit_curve("tau", measurements, block_size=16)
    assert smallest_size_reaching(fit, 3.9) == pytest.approx(3600, rel=1e-3)
    assert smallest_size_reaching(fit, 4.5) is None  # above the plateau


def _exact(size: int, tau_of_n, positions: int = 3, prompts: int = 4) -> Measurement:
    """A measurement whose per-position shares make tau_of_n(size): all the gain on position 1..k evenly."""
    gain = tau_of_n(size) - 1.0
    shares = np.array([min(1.0, max(0.0, gain - k)) for k in range(positions)])
    cycles = np.full(prompts, 100.0)
    return Measurement(size=size, seed=0, cycles=cycles, accepted=np.tile(shares * 100.0, (prompts, 1)))


def test_both_methods_are_judged_on_the_largest_size_from_the_smaller_ones():
    sizes = [50, 100, 200, 400]
    measurements = [_exact(size, lambda n: 3.0 - 8.0 * n ** -0.5) for size in sizes]
    checks = {check.method: check for check in compare_methods(measurements, block_size=4)}
    assert set(checks) == {"tau", "positions"}
    truth = measured_tau(measurements)[400]
    assert truth == pytest.approx(3.0 - 8.0 / 20.0)
    assert checks["tau"].measured == pytest.approx(truth)
    assert checks["tau"].error < 1e-6  # an exact power law in tau is predicted exactly by the tau fit
    assert compare_methods(measurements[:2], block_size=4) is None


def test_the_interval_comes_from_prompts_and_seeds_and_holds_the_point():
    rng = np.random.default_rng(0)
    measurements = []
    for size in (40, 80, 160):
        for seed in (0, 1):
            cycles = rng.integers(20, 40, size=6).astype(float)
            share = 0.8 - 2.0 * size ** -0.5
            accepted = np.stack([rng.binomial(cycles.astype(int), share), rng.binomial(cycles.astype(int), share / 2)], axis=1)
            measurements.append(Measurement(size, seed, cycles, accepted.astype(float)))
    fit = fit_curve("positions", measurements, block_size=3)
    replicas = bootstrap_fits("positions", measurements, block_size=3, replicates=50, seed=1)
    [near, far] = predict_with_interval(fit, replicas, [160, 10_000])
    assert near.low <= near.tau <= near.high and near.high - near.low > 0
    assert far.high - far.low >= near.high - near.low  # less certain further out
    assert not near.extrapolated and far.extrapolated
    assert support_limit([40, 80, 160]) == 640 and not far.supported
