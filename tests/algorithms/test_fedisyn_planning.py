"""The per-round system plan's pure pieces: host-time fit and the plan itself."""

import numpy as np
import pytest

from fl_lightning.algorithms.synthetic_family.config import SystemsConfig
from fl_lightning.algorithms.synthetic_family.planning import SystemPlan, client_profiles, fit_host_times, plan_round
from fl_lightning.systems.backbones import backbone


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
    plan = plan_round(
        cfg,
        clients=range(10),
        profiles=profiles,
        samples=rng.integers(50, 500, 10).astype(float),
        contributions=rng.uniform(0.1, 1.0, (10, 12)),
        layer_bits=8 * 32 * 768 * 2 * 4,
        num_layers=12,
    )
    for x, p in zip(plan.depths, profiles):
        assert 1 <= x <= 12 and p.fixed_memory_gb + x * p.memory_per_layer_gb <= p.memory_budget_gb + 1e-12
    assert plan.bandwidth_hz.sum() == pytest.approx(cfg.total_bandwidth_hz, rel=1e-9)
    assert (plan.bandwidth_hz >= 0).all() and plan.round_time_s >= plan.compute_time_s.max()


def _channel_by_hand(cfg: SystemsConfig, profiles) -> np.ndarray:
    """e_i = log2(1 + p_i g_i / σ²), g_i = 10^(−PL0/10) (d_i / d0)^(−α), from the seeded positions (float64)."""
    from fl_lightning.systems.channel import place_devices

    pos = place_devices(len(profiles), radius_m=cfg.radius_m, center_m=(cfg.center_x_m, 0.0), seed=cfg.placement_seed)
    d = np.hypot(pos[:, 0], pos[:, 1])
    g = 10 ** (-cfg.reference_loss_db / 10) * (d / cfg.d0_m) ** (-cfg.path_loss_exponent)
    p = np.array([pr.transmit_power_w for pr in profiles])
    return np.log2(1 + p * g / cfg.noise_power_w)


def _hand_round(cfg, profiles, samples, depths, payload_bits):
    H = np.array([s * (p.forward_time_s + x * p.backward_time_per_layer_s) for s, p, x in zip(samples, profiles, depths)])
    e = _channel_by_hand(cfg, profiles)
    return H, e, np.max(H + payload_bits / (cfg.total_bandwidth_hz / len(H) * e))  # the equal split's finish


@pytest.mark.parametrize("extra_bits", [0.0, 3.0e6])
def test_equal_split_round_time_matches_the_channel_by_hand_and_counts_the_head(extra_bits):
    """w/o WFBA: B_i = B/N and H^t = max_i (H_i + S_i N / (B e_i)); the head's bits are in S_i when it trains."""
    cfg = SystemsConfig(depth_policy="fixed", fixed_depth=2, bandwidth_allocation="equal")
    profiles = client_profiles(cfg, 6)
    samples = np.linspace(100, 600, 6)
    tau = 8 * 32 * 768 * 2 * 4
    plan = plan_round(
        cfg,
        clients=range(6),
        profiles=profiles,
        samples=samples,
        contributions=np.ones((6, 12)),
        layer_bits=tau,
        num_layers=12,
        extra_bits=extra_bits,
    )
    payload = tau * plan.depths + extra_bits
    _, _, T = _hand_round(cfg, profiles, samples, plan.depths, payload)
    np.testing.assert_allclose(plan.bandwidth_hz, cfg.total_bandwidth_hz / 6)
    np.testing.assert_allclose(plan.payload_bits, payload)
    assert plan.round_time_s == pytest.approx(T, rel=1e-12)


def test_wfba_is_never_slower_than_the_equal_split_on_the_same_depths():
    profiles = client_profiles(SystemsConfig(), 10)
    samples = np.full(10, 5000.0)
    kw = dict(
        clients=range(10),
        profiles=profiles,
        samples=samples,
        contributions=np.ones((10, 12)),
        layer_bits=1_179_648.0,
        num_layers=12,
    )
    wfba = plan_round(SystemsConfig(depth_policy="capacity"), **kw)
    equal = plan_round(SystemsConfig(depth_policy="capacity", bandwidth_allocation="equal"), **kw)
    np.testing.assert_array_equal(wfba.depths, equal.depths)
    assert wfba.round_time_s < equal.round_time_s
    # WFBA: every device with a payload finishes exactly at H^t (Alg. 2)
    H, e, _ = _hand_round(SystemsConfig(), profiles, samples, wfba.depths, wfba.payload_bits)
    np.testing.assert_allclose(H + wfba.payload_bits / (wfba.bandwidth_hz * e), wfba.round_time_s, rtol=1e-9)


def _even_plan(cfg, profiles, samples: float, num_layers: int, **extra):
    """``plan_round`` over every client of ``profiles``, each with ``samples`` samples and the same contribution in
    every one of ``num_layers`` layers, 1e6 bits a layer."""
    n = len(profiles)
    contributions = np.ones((n, num_layers))
    return plan_round(
        cfg,
        clients=range(n),
        profiles=profiles,
        samples=np.full(n, samples),
        contributions=contributions,
        layer_bits=1e6,
        num_layers=num_layers,
        **extra,
    )


def test_a_policy_that_asks_for_more_than_memory_is_reported_not_silently_capped():
    cfg = SystemsConfig(depth_policy="full")
    # the paper testbed with ViT-L/16 at batch 32 (Food-101): Orin NX boards hold 20 of 24 blocks
    profiles = client_profiles(cfg, 10, backbone=backbone("vit_large_patch16_224"), batch_size=32)
    plan = _even_plan(cfg, profiles, samples=100.0, num_layers=24)
    limits = np.array(
        [min(int(np.floor((p.memory_budget_gb - p.fixed_memory_gb) / p.memory_per_layer_gb + 1e-9)), 24) for p in profiles]
    )
    np.testing.assert_array_equal(plan.requested, 24)
    np.testing.assert_array_equal(plan.limits, limits)
    np.testing.assert_array_equal(plan.depths, np.minimum(24, limits))
    np.testing.assert_array_equal(plan.over_memory, limits < 24)
    assert plan.over_memory.any() and not plan.over_memory.all()
    back = SystemPlan.from_decisions(plan.as_decisions())  # the checkpointed form keeps what was requested
    np.testing.assert_array_equal(back.requested, plan.requested)
    np.testing.assert_array_equal(back.over_memory, plan.over_memory)


def test_full_parameter_fedavg_uploads_the_whole_model_at_full_depth():
    cfg = SystemsConfig(bandwidth_allocation="equal")
    profiles = client_profiles(cfg, 4)
    model_bits = 32.0 * 5_000_000
    plan = _even_plan(cfg, profiles, samples=50.0, num_layers=12, full_model_bits=model_bits)
    np.testing.assert_array_equal(plan.depths, 12)  # every weight trains, whatever memory LoRA would allow
    np.testing.assert_allclose(plan.payload_bits, model_bits)
    _, _, T = _hand_round(cfg, profiles, np.full(4, 50.0), plan.depths, plan.payload_bits)
    assert plan.round_time_s == pytest.approx(T, rel=1e-12)


@pytest.mark.parametrize("allocation", ["equal", "wfba"])
def test_the_synthesis_upload_is_timed_on_the_channel_by_hand(allocation):
    """Round 0's latents/captions/counts: no compute first; B/N → max_i S_i N / (B e_i); WFBA → everyone finishes
    together at Σ_i S_i / e_i / B (φ(T) = Σ a_i / T − B = 0 with H = 0)."""
    from fl_lightning.algorithms.synthetic_family.planning import upload_time_s

    cfg = SystemsConfig(bandwidth_allocation=allocation)
    profiles = client_profiles(cfg, 4)
    bits = {0: 8e6, 1: 2.4e7, 2: 1.6e6, 3: 4e6}
    e = _channel_by_hand(cfg, profiles)
    S = np.array([bits[c] for c in range(4)])
    expected = (
        np.max(S * 4 / (cfg.total_bandwidth_hz * e)) if allocation == "equal" else float((S / e).sum() / cfg.total_bandwidth_hz)
    )
    assert upload_time_s(cfg, profiles, bits) == pytest.approx(expected, rel=1e-9)
    assert upload_time_s(cfg, profiles, {}) == 0.0
