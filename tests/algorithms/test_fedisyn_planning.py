"""The per-round system plan's pure pieces: host-time fit and the plan itself."""

import numpy as np
import pytest

from fl_lightning.algorithms.fedisyn.planning import client_profiles, fit_host_times, plan_round
from fl_lightning.algorithms.fedisyn.config import SystemsConfig


def test_fit_host_times_recovers_forward_and_backward_times():
    h_bar, h = 0.004, 0.0015  # s per sample, s per sample per trained block
    samples = {0: 100.0, 1: 250.0, 2: 80.0, 3: 400.0}
    depths = {0: 1, 1: 2, 2: 4, 3: 3}
    compute = {c: samples[c] * (h_bar + depths[c] * h) for c in samples}
    assert fit_host_times(compute, samples, depths) == pytest.approx((h_bar, h), rel=1e-9)
    # one depth only cannot separate h̄ from h
    assert fit_host_times(compute, samples, {c: 2 for c in samples}) is None
    assert fit_host_times({0: 1.0}, {0: 10.0}, {0: 1}) is None


@pytest.mark.parametrize("policy", ["clc", "capacity", "full", "fixed"])
def test_plan_respects_memory_and_finishes_everyone_together(policy):
    cfg = SystemsConfig(depth_policy=policy, fixed_depth=3)
    profiles = client_profiles(cfg, 10)
    rng = np.random.default_rng(0)
    plan = plan_round(cfg, clients=range(10), profiles=profiles, samples=rng.integers(50, 500, 10).astype(float),
                      contributions=rng.uniform(0.1, 1.0, (10, 12)), layer_bits=8 * 32 * 768 * 2 * 4, num_layers=12)
    for x, p in zip(plan.depths, profiles):
        assert 1 <= x <= 12 and p.fixed_memory_gb + x * p.memory_per_layer_gb <= p.memory_budget_gb + 1e-12
    assert plan.bandwidth_hz.sum() == pytest.approx(cfg.total_bandwidth_hz, rel=1e-9)
    assert (plan.bandwidth_hz >= 0).all() and plan.round_time_s >= plan.compute_time_s.max()
