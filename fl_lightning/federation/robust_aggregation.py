"""Byzantine-robust aggregators (``federation.aggregator``), computed as Flower's strategies of the same names.

Each rule reads the round's n client weight vectors (every floating-point tensor of the state, flattened and
concatenated in key order: one row per client, client order) — the clients' weights, not their updates — and
returns the new weights:

* ``median``        the coordinate-wise median, unweighted (even n: the mean of the two middle values; Yin et al.
                    2018; Flower's ``FedMedian``);
* ``trimmed_mean``  per coordinate, the c = ⌊β·n⌋ smallest and c largest values dropped and the rest averaged,
                    unweighted (Yin et al. 2018; Flower's ``FedTrimmedAvg``, β = ``trim_fraction``, default 0.2);
* ``krum``          the one client whose score — the sum of its m = max(1, n − f − 2) smallest squared distances
                    to the others — is lowest (the first on a tie; Blanchard et al. 2017; Flower's ``Krum``);
* ``multi_krum``    the q lowest-scored clients averaged, weighted by their example counts (q = ``num_to_keep``,
                    null: n − f);
* ``bulyan``        θ = n − 2f clients picked by Krum one at a time from the shrinking rest, then per coordinate the
                    β = θ − 2f values closest to the picked clients' median averaged, unweighted (El Mhamdi et al.
                    2018; Flower's ``Bulyan``; needs n ≥ 4f + 3).

f is ``num_malicious``. The rules are pure functions on a (n, d) tensor, tested against Flower's outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from fl_lightning.config import AggregatorConfig
    from fl_lightning.federation.transport import Upload

__all__ = ["RobustAggregator", "coordinate_median", "trimmed_mean", "krum_scores", "krum_pick", "bulyan"]


def coordinate_median(rows: Tensor) -> Tensor:
    """The coordinate-wise median of ``rows`` (n, d); an even n averages the two middle values (numpy's)."""
    ordered, n = rows.sort(dim=0).values, rows.shape[0]
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(rows: Tensor, beta: float) -> Tensor:
    """Per coordinate, the mean of ``rows`` (n, d) without its ⌊β·n⌋ smallest and largest values."""
    n = rows.shape[0]
    cut = int(beta * n)
    if n - 2 * cut < 1:
        raise ValueError(f"trimming {cut} of {n} values at each end leaves none (trim_fraction {beta} < 0.5)")
    return rows.sort(dim=0).values[cut : n - cut].mean(dim=0)


def krum_scores(rows: Tensor, num_malicious: int) -> Tensor:
    """Each row's Krum score: the sum of its m = max(1, n − f − 2) smallest squared distances to the other rows."""
    n = rows.shape[0]
    distances = torch.cdist(rows.double(), rows.double(), compute_mode="donot_use_mm_for_euclid_dist") ** 2
    m = max(1, n - num_malicious - 2)
    distances.fill_diagonal_(-1.0)  # the row itself sorts first and is skipped
    return distances.sort(dim=1).values[:, 1 : m + 1].sum(dim=1)


def krum_pick(rows: Tensor, num_malicious: int, keep: int) -> list[int]:
    """The ``keep`` rows of lowest Krum score (ties: the first), lowest first."""
    scores = krum_scores(rows, num_malicious)
    return sorted(range(rows.shape[0]), key=lambda i: (float(scores[i]), i))[:keep]


def bulyan(rows: Tensor, num_malicious: int) -> Tensor:
    """Bulyan's aggregate of ``rows`` (n, d) with f = ``num_malicious`` (module docstring)."""
    n, f = rows.shape[0], num_malicious
    if n < 4 * f + 3:
        raise ValueError(f"Bulyan needs n >= 4f + 3 clients: {n} uploads for num_malicious f = {f}")
    theta, beta = n - 2 * f, n - 4 * f
    rest, picked = list(range(n)), []
    for _ in range(theta):
        best = rest[krum_pick(rows[rest], f, 1)[0]]
        picked.append(best)
        rest.remove(best)
    chosen = rows[picked]
    closest = (chosen - coordinate_median(chosen)).abs().argsort(dim=0, stable=True)[:beta]
    return chosen.gather(0, closest).mean(dim=0)


@dataclass(frozen=True)
class RobustAggregator:
    """``federation.aggregator``: a rule of the module docstring with its settings."""

    name: str = "mean"
    trim_fraction: float = 0.2
    num_malicious: int = 0
    num_to_keep: int | None = None

    @classmethod
    def of(cls, config: AggregatorConfig) -> RobustAggregator:
        return cls(config.name, config.trim_fraction, config.num_malicious, config.num_to_keep)

    @property
    def is_mean(self) -> bool:
        return self.name == "mean"

    def combine(self, rows: Tensor, weights: Sequence[float]) -> Tensor:
        """The rule on ``rows`` (n, d) with the clients' example counts ``weights`` (used by Multi-Krum only)."""
        if self.name == "median":
            return coordinate_median(rows)
        if self.name == "trimmed_mean":
            return trimmed_mean(rows, self.trim_fraction)
        if self.name == "bulyan":
            return bulyan(rows, self.num_malicious)
        n = rows.shape[0]
        keep = 1 if self.name == "krum" else (self.num_to_keep or n - self.num_malicious)
        picked = krum_pick(rows, self.num_malicious, min(keep, n))
        w = torch.tensor([float(weights[i]) for i in picked], dtype=torch.float64)
        return ((rows[picked].double() * w[:, None]).sum(dim=0) / w.sum()).to(rows.dtype)

    def aggregate(self, state: Mapping[str, Tensor], uploads: Mapping[int, Upload]) -> dict[str, Tensor]:
        """The new values of ``state``'s floating-point tensors that every upload holds, by the rule over the
        uploads in client order (the weights are the clients', not their updates)."""
        clients = sorted(uploads)
        read = [uploads[c] for c in clients]
        keys = [k for k, t in state.items() if t.is_floating_point() and all(k in u.tensors for u in read)]
        if not read or not keys:
            return {}
        dtype = torch.promote_types(state[keys[0]].dtype, torch.float32)
        rows = torch.stack([torch.cat([u.tensors[k].detach().reshape(-1).to(dtype) for k in keys]) for u in read])
        combined = self.combine(rows, [u.meta.get("num_samples", 1) for u in read])
        out, start = {}, 0
        for k in keys:
            size = state[k].numel()
            out[k] = combined[start : start + size].reshape(state[k].shape).to(state[k].device, state[k].dtype)
            start += size
        return out
