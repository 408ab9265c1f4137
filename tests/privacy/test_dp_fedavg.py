"""DP-FedAvg's clipping bounds a user's influence; the fixed denominator D makes its noise σS/D the Gaussian
mechanism's on the sum, whatever number of uploads arrived."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.privacy.dp_fedavg import clip_update, private_mean, update_norm


def _state(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(5, 3, generator=g) * scale, "b": torch.randn(3, generator=g) * scale, "steps": torch.tensor(7)}


def test_clipping_bounds_each_update_and_so_the_sum_moves_by_at_most_S():
    S = 0.5
    glob = _state(0)
    uploads = [{k: glob[k] + v for k, v in _state(s, scale=float(s)).items()} for s in range(1, 6)]
    clipped = [clip_update(glob, u, S)[0] for u in uploads]
    for c in clipped:
        assert update_norm(glob, c, ["w", "b"]) <= S * (1 + 1e-6)
        assert torch.equal(c["steps"], uploads[0]["steps"])  # integer buffers are not part of the update
    # sensitivity: removing one user changes Σ_k Δ̃_k by that user's clipped update, ≤ S in L2
    total = {k: sum(c[k].double() - glob[k].double() for c in clipped) for k in ("w", "b")}
    for drop in range(len(clipped)):
        rest = {k: sum(c[k].double() - glob[k].double() for i, c in enumerate(clipped) if i != drop) for k in ("w", "b")}
        assert math.sqrt(sum(float((total[k] - rest[k]).pow(2).sum()) for k in total)) <= S * (1 + 1e-6)


def test_an_update_within_the_norm_is_returned_bit_for_bit():
    glob = _state(0)
    up = {k: glob[k] + 1e-3 * v for k, v in _state(1).items() if k != "steps"}
    out, norm = clip_update(glob, up, math.inf)
    assert norm > 0 and all(out[k] is up[k] for k in up)


def test_noise_on_the_estimate_has_std_sigma_S_over_the_fixed_denominator():
    sigma, S, draws, D = 1.3, 0.7, 4000, 5
    zeros = {"w": torch.zeros(draws, 8), "half": torch.zeros(draws, 8)}
    out = private_mean(
        zeros,
        zeros,
        {"w": 5, "half": 2},
        denominator=D,
        noise_multiplier=sigma,
        clip_norm=S,
        generator=torch.Generator().manual_seed(0),
    )
    for key in ("w", "half"):  # σS/D for every key: a key two clients hold is not noised as if D were 2
        assert out[key].std().item() == pytest.approx(sigma * S / D, rel=0.03)
        assert abs(out[key].mean().item()) < 4 * sigma * S / D / math.sqrt(out[key].numel())
    assert (
        private_mean(
            zeros, zeros, {"w": 5}, denominator=5, noise_multiplier=0.0, clip_norm=math.inf, generator=torch.Generator()
        )["w"]
        is zeros["w"]
    )


def test_the_estimate_is_the_sum_over_the_fixed_denominator_not_the_mean_of_the_arrivals():
    """Two of D = 4 planned clients arrive with updates 1 and 3 from w_t = 10: (1 + 3)/4 = 1 from w_t, not their
    mean 2; one user then moves the estimate by its clipped update / D, whoever else arrived."""
    previous, mean = {"w": torch.full((3,), 10.0)}, {"w": torch.full((3,), 12.0)}
    out = private_mean(previous, mean, {"w": 2}, denominator=4, noise_multiplier=0.0, clip_norm=1.0, generator=torch.Generator())
    assert torch.allclose(out["w"], torch.full((3,), 11.0))
    with pytest.raises(ValueError, match="denominator"):
        private_mean(previous, mean, {"w": 2}, denominator=0, noise_multiplier=0.0, clip_norm=1.0, generator=torch.Generator())
