"""DP-FedAvg's clipping bounds a user's influence; its noise has the Gaussian mechanism's std σS/m."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.privacy.dp_fedavg import add_mean_noise, clip_update, update_norm


def _state(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(5, 3, generator=g) * scale, "b": torch.randn(3, generator=g) * scale,
            "steps": torch.tensor(7)}


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
        rest = {k: sum(c[k].double() - glob[k].double() for i, c in enumerate(clipped) if i != drop)
                for k in ("w", "b")}
        assert math.sqrt(sum(float((total[k] - rest[k]).pow(2).sum()) for k in total)) <= S * (1 + 1e-6)


def test_an_update_within_the_norm_is_returned_bit_for_bit():
    glob = _state(0)
    up = {k: glob[k] + 1e-3 * v for k, v in _state(1).items() if k != "steps"}
    out, norm = clip_update(glob, up, math.inf)
    assert norm > 0 and all(out[k] is up[k] for k in up)


def test_noise_on_the_mean_has_std_sigma_S_over_m():
    sigma, S, draws = 1.3, 0.7, 4000
    state = {"w": torch.zeros(draws, 8), "half": torch.zeros(draws, 8)}
    out = add_mean_noise(state, {"w": 5, "half": 2}, noise_multiplier=sigma, clip_norm=S,
                         generator=torch.Generator().manual_seed(0))
    for key, m in (("w", 5), ("half", 2)):
        assert out[key].std().item() == pytest.approx(sigma * S / m, rel=0.03)
        assert abs(out[key].mean().item()) < 4 * sigma * S / m / math.sqrt(out[key].numel())
    assert add_mean_noise(state, {"w": 5}, noise_multiplier=0.0, clip_norm=math.inf,
                          generator=torch.Generator())["w"] is state["w"]
