"""Record-level DP of R, C: clipped features bound one record's effect by Δ; the noisy R stays PSD."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.analytic import AnalyticStatistics
from fl_lightning.privacy.statistics import clip_features, noise_statistics, sensitivity


def _wire(h: torch.Tensor, y: torch.Tensor, c: int) -> torch.Tensor:
    up = AnalyticStatistics.zeros(h.shape[1], c).update(h, y).to_upload()
    return torch.cat([up["R_upper"], up["C"].flatten()])


@pytest.mark.parametrize("clip", [0.3, 1.0, 4.0])
def test_one_record_moves_the_wire_format_by_at_most_the_sensitivity(clip):
    g = torch.Generator().manual_seed(0)
    h = clip_features(torch.randn(50, 6, generator=g, dtype=torch.float64) * 3, clip)
    y = torch.randint(0, 4, (50,), generator=g)
    assert torch.linalg.vector_norm(h, dim=1).max() <= clip * (1 + 1e-12)
    full = _wire(h, y, 4)
    worst = max(
        float(torch.linalg.vector_norm(full - _wire(torch.cat([h[:i], h[i + 1 :]]), torch.cat([y[:i], y[i + 1 :]]), 4)))
        for i in range(50)
    )
    assert worst <= sensitivity(clip) * (1 + 1e-9)
    # a record at the clip norm with one component reaches it up to the off-diagonal terms: the bound is tight
    # for a feature along one axis (upper(hhᵀ) = c² e₁₁)
    e = torch.zeros(1, 6, dtype=torch.float64)
    e[0, 0] = clip
    assert float(torch.linalg.vector_norm(_wire(e, y[:1], 4))) == pytest.approx(sensitivity(clip))


def test_noisy_R_is_positive_semidefinite_and_the_noise_has_the_asked_std():
    g = torch.Generator().manual_seed(1)
    h = clip_features(torch.randn(20, 16, generator=g, dtype=torch.float64), 1.0)
    stats = AnalyticStatistics.zeros(16, 3).update(h, torch.randint(0, 3, (20,), generator=g))
    up = stats.to_upload()
    std = 5.0  # large against R's eigenvalues: without the shift R + Z would be indefinite
    noisy = noise_statistics(up, std=std, generator=torch.Generator().manual_seed(2))
    R = AnalyticStatistics.from_upper(noisy["R_upper"], noisy["C"], 20).R
    R0 = stats.symmetric().R
    assert torch.linalg.eigvalsh(R).min() >= torch.linalg.eigvalsh(R0).min() - 1e-9
    unshifted = noise_statistics(up, std=std, generator=torch.Generator().manual_seed(2), psd_shift=False)
    assert torch.linalg.eigvalsh(AnalyticStatistics.from_upper(unshifted["R_upper"], up["C"], 20).R).min() < 0
    assert torch.allclose(unshifted["C"], noisy["C"])  # the shift touches R's diagonal only
    many = noise_statistics(
        {"R_upper": torch.zeros(3), "C": torch.zeros(200, 50, dtype=torch.float64)},
        std=std,
        generator=torch.Generator().manual_seed(3),
        psd_shift=False,
    )
    assert many["C"].std().item() == pytest.approx(std, rel=0.03)


def test_class_counts_stay_integers():
    up = {
        "R_upper": torch.zeros(3, dtype=torch.float64),
        "C": torch.zeros(2, 2, dtype=torch.float64),
        "counts": torch.tensor([5, 7]),
    }
    out = noise_statistics(up, std=2.0, generator=torch.Generator().manual_seed(0))
    assert out["counts"].dtype == torch.int64 and not torch.equal(out["counts"], up["counts"])
    assert sensitivity(2.0, with_counts=True) == pytest.approx(math.sqrt(16 + 4 + 1))
