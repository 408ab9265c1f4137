"""A client's validation share, carved from its own training data (pure, seeded, numpy only).

Used where a method chooses something on held-out data (FedOPAL+'s head and λ,
``algorithms/fedopal_plus.py``): the choice must never read the test split, and what is held out must
not be trained on. Each client holds out ``floor(fraction · n)`` of its n samples, drawn without
replacement by ``np.random.default_rng(seed)`` owned by the call (never the global RNG): the same
(n, fraction, seed) always gives the same share, and the share depends on nothing else.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["validation_split"]


def validation_split(num_samples: int, fraction: float, seed: int | tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Split positions 0..n−1 of a client's data into a fit share and a validation share.

    Args:
        num_samples: n ≥ 0.
        fraction: in [0, 1): the validation share holds ``floor(fraction · n)`` positions, so the fit
            share is never empty for n ≥ 1.
        seed: seed of the private generator (e.g. ``(run seed, client index)``).

    Returns:
        ``(fit, val)``: sorted int64 positions, disjoint, together exactly 0..n−1.
    """
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    n_val = math.floor(fraction * num_samples)
    held = np.zeros(num_samples, dtype=bool)
    held[np.random.default_rng(seed).permutation(num_samples)[:n_val]] = True
    positions = np.arange(num_samples, dtype=np.int64)
    return positions[~held], positions[held]
